"""Tensors in the layout a model's checkpoints are released in, from the layout transformers holds in memory.

transformers 5 rewrites some checkpoints while loading them, as its ``conversion_mapping`` lists per model type, and
undoes most rewrites when saving, but not the in-place transposes of Qwen3-VL-MoE's experts. The released files hold
``mlp.experts.gate_up_proj`` as (experts, hidden, 2 x intermediate) and ``mlp.experts.down_proj`` as (experts,
intermediate, hidden); transformers transposes both on load, to (experts, 2 x intermediate, hidden) and (experts,
hidden, intermediate), and only when the file's shape differs from the module's, so on saving (where the shapes
always agree) it keeps the in-memory layout. vLLM reads the released layout: it rejects the in-memory one, or, where
hidden = 2 x intermediate, reads it wrongly without a word.

The transposes are read from transformers' own mapping (a converter that keeps the tensor's name and only transposes
it), so the list follows the installed transformers. Other rewrites need nothing here: the per-expert tensors of
Qwen2-MoE / Qwen3-MoE checkpoints, which transformers stacks into (experts, 2 x intermediate, hidden) with gate before
up, are read as they are by vLLM (its fused-expert loader splits them the same way), and ``save_pretrained`` splits
them back itself.
"""

import functools
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import torch
from transformers import PreTrainedModel
from transformers.conversion_mapping import get_checkpoint_conversion_mapping
from transformers.core_model_loading import Transpose, WeightConverter, revert_weight_conversion

from ..utils.files import open_like_new_files


@dataclass(frozen=True)
class InPlaceTranspose:
    """One tensor transformers transposes on load under the same name: ``dims`` in the order it applies them."""

    pattern: re.Pattern
    """transformers' own regular expression for the tensor's name (e.g. ``mlp.experts.gate_up_proj``)."""
    dims: tuple[tuple[int, int], ...]

    def matches(self, name: str) -> bool:
        # the name must end with the pattern: `gate_up_proj` must not catch a `gate_up_proj_bias`
        match = self.pattern.search(name)
        return match is not None and match.end() == len(name)

    def to_released(self, tensor: torch.Tensor) -> torch.Tensor:
        """The released layout of an in-memory tensor: the load's transposes undone, last first (a view)."""
        for dim0, dim1 in reversed(self.dims):
            tensor = tensor.transpose(dim0, dim1)
        return tensor


@functools.cache
def in_place_transposes(model_type: str) -> tuple[InPlaceTranspose, ...]:
    """The tensors of ``model_type`` (a config's ``model_type``, e.g. ``qwen3_vl_moe``) that transformers transposes
    on load and saves transposed; empty for most models."""
    transposes = []
    for transform in get_checkpoint_conversion_mapping(model_type) or []:
        if not isinstance(transform, WeightConverter) or len(transform.source_patterns) != 1:
            continue
        if transform.source_patterns != transform.target_patterns:  # renamed too: save_pretrained undoes it
            continue
        if not transform.operations or not all(isinstance(op, Transpose) for op in transform.operations):
            continue
        dims = tuple((op.dim0, op.dim1) for op in transform.operations)
        transposes.append(InPlaceTranspose(pattern=transform.compiled_sources, dims=dims))
    return tuple(transposes)


def _transpose_for(model_type: str, name: str) -> InPlaceTranspose | None:
    return next((t for t in in_place_transposes(model_type) if t.matches(name)), None)


def to_released_layout(
    model_type: str, named_tensors: Iterable[tuple[str, torch.Tensor]]
) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor) pairs in transformers' in-memory layout -> the same pairs in the released layout (views)."""
    for name, tensor in named_tensors:
        transpose = _transpose_for(model_type, name)
        yield name, (tensor if transpose is None else transpose.to_released(tensor))


def released_dtype(config) -> torch.dtype | None:
    """The floating dtype a checkpoint's weights are stored in, as its config says (``dtype``); None if unsaid.

    Training holds the weights in its own dtype (fp32 master weights) and transformers then reports that one in the
    live config, so the folders easyrl writes take the released dtype from the model path's config instead: a
    Qwen2.5-7B released in bf16 is written in bf16, as EasyR1's merger does, not in fp32 at twice the size."""
    dtype = getattr(config, "dtype", None)
    if isinstance(dtype, str):
        dtype = getattr(torch, dtype, None)
    return dtype if isinstance(dtype, torch.dtype) and dtype.is_floating_point else None


def set_config_dtype(config, dtype: torch.dtype | None) -> None:
    """Say ``dtype`` in ``config`` and in its sub-configs (a VL model's text and vision configs)."""
    if dtype is None:
        return
    config.dtype = dtype
    for key in getattr(config, "sub_configs", {}) or {}:
        sub_config = getattr(config, key, None)
        if sub_config is not None and hasattr(sub_config, "dtype"):
            sub_config.dtype = dtype


def save_pretrained_in_released_layout(model: PreTrainedModel, path: str, dtype: torch.dtype | None = None) -> None:
    """``model.save_pretrained(path)``, with files in the released layout, so that vLLM and transformers both read
    them. transformers writes the rest of the layout (its own reverse mapping, e.g. Qwen3-MoE's per-expert tensors).
    ``dtype``: the floating weights are cast to it first (the model is changed in place)."""
    if dtype is not None:
        model.to(dtype)
        set_config_dtype(model.config, dtype)
    model_type = model.config.model_type
    if in_place_transposes(model_type):
        _save_with_transposes_undone(model, model_type, path)
    else:
        model.save_pretrained(path)
    open_like_new_files(path)


def _save_with_transposes_undone(model: PreTrainedModel, model_type: str, path: str) -> None:
    """``save_pretrained`` of a state whose in-place transposes are put back in the released layout."""
    in_memory_shapes = {name: tensor.shape for name, tensor in model.state_dict().items()}
    state = {}
    for name, tensor in revert_weight_conversion(model, model.state_dict()).items():
        transpose = _transpose_for(model_type, name)
        # only while still in the in-memory shape: a transformers that undoes the transpose itself is not undone
        if transpose is not None and tensor.shape == in_memory_shapes.get(name):
            tensor = transpose.to_released(tensor)
        state[name] = tensor
    # the state is final: saving in the "original format" would apply transformers' reverse mapping a second time
    model.save_pretrained(path, state_dict=state, save_original_format=False)
