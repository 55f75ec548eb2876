"""Models that ship with easyrl, addressed as ``builtin://NAME`` in ``worker.actor.model.model_path``."""

from collections.abc import Callable
from pathlib import Path

from .small_vlm import ensure_small_qwen2_5_vl
from .smollm2 import ensure_smollm2


BUILTIN_PREFIX = "builtin://"
BUILTIN_MODELS: dict[str, Callable[[], Path]] = {"SmolLM2-135M-Instruct": ensure_smollm2}


def _tiny_vlm(family: str) -> Callable[[], Path]:
    def ensure() -> Path:
        from ..testing.tiny_vlms import ensure_tiny_vlm

        return ensure_tiny_vlm(family)

    return ensure


# tiny random vision-language models (offline, seconds to build): for trying VL recipes on a CPU, not for learning
BUILTIN_MODELS.update(
    {
        "Tiny-Qwen2-VL": _tiny_vlm("qwen2_vl"),
        "Tiny-Qwen2.5-VL": _tiny_vlm("qwen2_5_vl"),
        "Tiny-Qwen3-VL": _tiny_vlm("qwen3_vl"),
        # untrained, standard initialisation, sized to learn a picture task on a CPU (the shapes cold start)
        "Small-Qwen2.5-VL": ensure_small_qwen2_5_vl,
    }
)


def resolve_model_path(path: str | None) -> str | None:
    """A ``builtin://`` name becomes its local Hugging Face folder (built on first use); other paths pass through."""
    if path is None or not path.startswith(BUILTIN_PREFIX):
        return path
    name = path[len(BUILTIN_PREFIX) :]
    if name not in BUILTIN_MODELS:
        raise ValueError(f"Unknown built-in model `{path}`; choose one of: {', '.join(BUILTIN_MODELS)}.")
    return str(BUILTIN_MODELS[name]())
