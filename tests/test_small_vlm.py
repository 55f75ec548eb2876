"""`builtin://Small-Qwen2.5-VL`: an untrained Qwen2.5-VL, standard initialisation, that the shapes cold start trains."""

import json

import torch
from safetensors.torch import load_file

from easyrl.demo.small_vlm import build_small_qwen2_5_vl, ensure_small_qwen2_5_vl


def test_small_vlm_is_saved_with_its_processor_at_the_standard_initialisation(tmp_path):
    folder = build_small_qwen2_5_vl(tmp_path / "small")
    config = json.loads((folder / "config.json").read_text())
    text = config.get("text_config", config)
    assert (text["hidden_size"], text["num_hidden_layers"], text["head_dim"]) == (128, 4, 32)  # vLLM CPU: head_dim 32
    assert config["vision_config"]["out_hidden_size"] == 128 and config["tie_word_embeddings"]
    assert (folder / "processor_config.json").exists() or (folder / "preprocessor_config.json").exists()
    weights = load_file(folder / "model.safetensors")
    (embedding,) = [w for name, w in weights.items() if name.endswith("embed_tokens.weight")]
    assert abs(float(embedding.std()) - 0.02) < 0.002  # initializer_range, not the tiny test models' wide 0.3
    norms = [w for name, w in weights.items() if name.endswith("input_layernorm.weight")]
    assert len(norms) == 4 and all(torch.equal(w, torch.ones_like(w)) for w in norms)


def test_ensure_builds_once_into_the_cache(tmp_path):
    first = ensure_small_qwen2_5_vl(tmp_path)
    stamp = (first / "model.safetensors").stat().st_mtime_ns
    assert ensure_small_qwen2_5_vl(tmp_path) == first and (first / "model.safetensors").stat().st_mtime_ns == stamp
