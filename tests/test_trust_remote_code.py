"""trust_remote_code is off by default: a checkpoint that ships its own code stops before Ray starts with an error that
names worker.actor.model.trust_remote_code=true, and loads once that key is set."""

import json
from pathlib import Path

import pytest

from easyrl.config import ModelConfig, PPOConfig, load_run_plan
from easyrl.data.tokenizer import load_tokenizer_and_processor
from easyrl.utils.remote_code import RemoteCodeRefusedError
from easyrl.workers.fsdp_utils import load_hf_config


ROOT = Path(__file__).resolve().parent.parent
CONFIG_CODE = """from transformers import Qwen2Config


class ShippedConfig(Qwen2Config):
    model_type = "shipped_lm"
"""
MODELING_CODE = """from torch import nn
from transformers import Qwen2ForCausalLM

from .configuration_shipped import ShippedConfig

# the checkpoint's own attention classes, picked by name as much shipped modeling code does
ATTENTION_CLASSES = {"eager": nn.Identity, "sdpa": nn.Identity, "flash_attention_2": nn.Identity}


class ShippedAttention(nn.Module):
    pass


class ShippedForCausalLM(Qwen2ForCausalLM):
    config_class = ShippedConfig

    def __init__(self, config):
        super().__init__(config)
        self.shipped_attention = ATTENTION_CLASSES[config._attn_implementation]()
"""
TOKENIZER_CODE = """from transformers import PreTrainedTokenizerFast


class ShippedTokenizer(PreTrainedTokenizerFast):
    pass
"""


@pytest.fixture(scope="module")
def remote_code_model(tmp_path_factory, tiny_model_path) -> Path:
    """The tiny model with a config class that lives in the checkpoint (auto_map), as custom architectures ship."""
    folder = tmp_path_factory.mktemp("remote_code_model")
    for file in Path(tiny_model_path).iterdir():
        (folder / file.name).write_bytes(file.read_bytes())
    config = json.loads((folder / "config.json").read_text())
    config.update(model_type="shipped_lm", auto_map={"AutoConfig": "configuration_shipped.ShippedConfig"})
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "configuration_shipped.py").write_text(CONFIG_CODE)
    return folder


def test_trust_remote_code_is_off_by_default():
    assert PPOConfig().worker.actor.model.trust_remote_code is False
    assert PPOConfig().worker.rollout.trust_remote_code is False


def test_model_config_that_needs_its_code_names_the_key(remote_code_model):
    with pytest.raises(RemoteCodeRefusedError, match=r"worker\.actor\.model\.trust_remote_code=true"):
        load_hf_config(ModelConfig(model_path=str(remote_code_model)), "causal_lm")
    with pytest.raises(RemoteCodeRefusedError, match=r"worker\.critic\.model\.trust_remote_code=true"):
        load_hf_config(ModelConfig(model_path=str(remote_code_model)), "value")
    allowed = load_hf_config(ModelConfig(model_path=str(remote_code_model), trust_remote_code=True), "causal_lm")
    assert type(allowed).__name__ == "ShippedConfig" and allowed.model_type == "shipped_lm"


def test_tokenizer_that_needs_its_code_names_the_key(tmp_path, tokenizer):
    # a tokenizer folder whose class exists only in the shipped file (with a model config of a known type,
    # transformers would quietly use its own class instead)
    folder = tmp_path / "shipped_tokenizer"
    tokenizer.save_pretrained(folder)
    settings = json.loads((folder / "tokenizer_config.json").read_text())
    settings.update(
        tokenizer_class="ShippedTokenizer", auto_map={"AutoTokenizer": [None, "tokenization_shipped.ShippedTokenizer"]}
    )
    (folder / "tokenizer_config.json").write_text(json.dumps(settings))
    (folder / "tokenization_shipped.py").write_text(TOKENIZER_CODE)
    with pytest.raises(RemoteCodeRefusedError, match=rf"{folder} ships its own model code.*trust_remote_code=true"):
        load_tokenizer_and_processor(str(folder))
    shipped, processor = load_tokenizer_and_processor(str(folder), trust_remote_code=True)
    assert type(shipped).__name__ == "ShippedTokenizer" and processor is None


def test_easyrl_run_stops_before_ray_and_names_the_key(tmp_path, remote_code_model):
    from easyrl.trainer.main import prepare_run_data
    from tests.fixtures.configs import driver_args

    args = driver_args(tmp_path, remote_code_model)
    with pytest.raises(RemoteCodeRefusedError, match=r"worker\.actor\.model\.trust_remote_code=true"):
        prepare_run_data(load_run_plan(args))
    data_ready = prepare_run_data(load_run_plan([*args, "worker.actor.model.trust_remote_code=true"]))
    assert data_ready.plan.config.worker.rollout.trust_remote_code is True  # the engine gets the same permission
    assert len(data_ready.train_loader) == 2


@pytest.mark.timeout(120)
def test_shipped_modeling_code_with_its_own_attention_table_loads_with_sdpa(
    tmp_path, remote_code_model, one_rank_gloo_group, caplog
):
    """Its table has no entry for easyrl's attention: the worker gives such a model sdpa, and it trains."""
    import torch
    from transformers import Qwen2ForCausalLM

    from easyrl.config import FSDPConfig
    from easyrl.workers.fsdp_utils import build_device_mesh, build_fsdp_model
    from tests.fsdp_helpers import make_batch

    folder = tmp_path / "shipped_model"
    folder.mkdir()
    for file in remote_code_model.iterdir():
        (folder / file.name).write_bytes(file.read_bytes())
    config = json.loads((folder / "config.json").read_text())
    config["auto_map"]["AutoModelForCausalLM"] = "modeling_shipped.ShippedForCausalLM"
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "modeling_shipped.py").write_text(MODELING_CODE)
    # transformers caches its answer on the class it asks: the shipped class derives from one asked before
    assert Qwen2ForCausalLM._can_set_attn_implementation()
    model = build_fsdp_model(
        ModelConfig(model_path=str(folder), trust_remote_code=True),
        FSDPConfig(torch_dtype="fp32", mp_param_dtype="fp32"),
        build_device_mesh(1, -1),
        kind="causal_lm",
        trainable=True,
        default_dtype=torch.float32,
    )
    assert type(model).__name__.endswith("ShippedForCausalLM")
    assert model.config._attn_implementation == "sdpa"
    assert "ShippedForCausalLM runs its own attention classes" in caplog.text
    batch = make_batch(batch_size=2).batch
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    logits.float().pow(2).mean().backward()
    assert torch.isfinite(logits).all()
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)
