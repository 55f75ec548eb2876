"""Ulysses sequence parallelism (DeepSpeed-Ulysses, arXiv 2309.14509): one packed sequence split over k ranks.

The k ranks of a sequence-parallel (sp) group receive the same micro-batch. Each packs it padding-free into one row,
pads the row to a multiple of k and keeps its contiguous 1/k slice of the tokens (with the slice of the FULL row's
position ids, so rotary positions are those of the whole sequence). Everything outside attention is per token and
runs on the slice. Around attention an all-to-all swaps the split: before it, every rank holds all heads of its
tokens; after it, 1/k of the heads for all tokens, so each rank attends over the whole sequence for its heads; a
second all-to-all swaps back. The outputs the roles need (log-probs, entropies, values at response tokens) are
computed on the slice and all-gathered back into whole sequences.

Gradients: the all-to-alls are autograd functions whose backward is the inverse all-to-all. Every rank of the group
computes the same loss on the gathered outputs, so the gather's backward SUMS the k ranks' gradients and keeps this
rank's rows: the parameter gradients of the group then add up to k times the gradient of its samples' loss, which
the FSDP average over all ``dp x k`` ranks turns into exactly the data-parallel average over the dp groups (the
loss denominators count each sample k times over the world, see ``ppo_update.global_loss_denominator``). So
``ulysses_size = k`` trains exactly as ``ulysses_size = 1`` does (up to float rounding).

Attention is hooked the way ``attention.py`` hooks it: a transformers attention function registered by name that
wraps the real one. It takes the sequence-parallel path only for calls that carry a ``ulysses`` keyword argument
(the packed forward of ``forward.py`` passes it down through the model); every other call (a padded batch, decoding
with a cache in the HF rollout, a vision tower) goes straight to the wrapped function.

Vision-language models (Qwen2.5-VL, Qwen3-VL): the ranks of the group share the vision tower's work. Each encodes a
share of the micro-batch's pictures and videos (whole items, balanced by patch count) and an all-gather gives every
rank the features of all of them (models/vision_encoder.py; its backward returns each item's gradient to the rank
that encoded it). The model inserts the features into the embeddings of the WHOLE row, and a pre-hook on the
language model then keeps this rank's slice of the embeddings, of the 3-D rope positions and of Qwen3-VL's deepstack
features. One long video is still one item: its encoder pass runs on one rank (splitting it by frames is not done).
"""

import contextlib
import functools
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

from ..utils import device
from . import attention, prefix_group
from .hf_config import check_heads
from .vision import vision_tower


NAME = "easyrl_ulysses"
FLASH_NAME = "easyrl_ulysses_flash"
KWARG = "ulysses"
# (start, end) of this rank's slice, for a VLM's language model (see ``_slice_language_model_inputs``)
SLICE_KWARG = "ulysses_slice"


@dataclass(frozen=True)
class SequenceParallel:
    """This rank's sequence-parallel group: ``size`` ranks that share micro-batches, this one at ``rank``."""

    group: dist.ProcessGroup
    size: int
    rank: int

    def bounds(self, padded_tokens: int) -> tuple[int, int]:
        """[start, end) of this rank's slice of a row of ``padded_tokens`` (a multiple of ``size``)."""
        width = padded_tokens // self.size
        return self.rank * width, (self.rank + 1) * width


def build_sequence_parallel(ulysses_size: int) -> SequenceParallel | None:
    """The (dp, sp) layout of the job: ranks ``[d * k, (d + 1) * k)`` form sp group d. None for ``ulysses_size`` 1.

    Every rank must call this (creating the groups is a collective). FSDP keeps sharding over ALL ranks (see
    ``fsdp_utils.build_device_mesh``): the sp ranks hold the same parameters, so sharding them k ways more saves
    memory; this mesh only provides the sp groups for the all-to-alls and gathers.
    """
    if ulysses_size == 1:
        return None
    world = dist.get_world_size()
    if world % ulysses_size != 0:
        raise ValueError(
            f"`ulysses_size` ({ulysses_size}) must divide the number of workers ({world}): set "
            f"worker.actor.ulysses_size / worker.critic.ulysses_size to a divisor of it."
        )
    mesh = init_device_mesh(
        device.get_device_name(), (world // ulysses_size, ulysses_size), mesh_dim_names=("dp", "sp")
    )
    group = mesh.get_group("sp")
    return SequenceParallel(group, ulysses_size, dist.get_rank(group))


def dispatch_layout(rank: int, world_size: int, ulysses_size: int) -> tuple[int, int, bool]:
    """(dp_rank, dp_size, is_collect) of ``rank``: the sp group shares one chunk of a batch, its first rank answers."""
    return rank // ulysses_size, world_size // ulysses_size, rank % ulysses_size == 0


# ----------------------------------------------------------------------------------------------------------------------
# model set-up
# ----------------------------------------------------------------------------------------------------------------------
def text_config(model: torch.nn.Module):
    """The config of the language model (a VLM's ``text_config``, else the model's own)."""
    config = model.config
    return getattr(config, "text_config", None) or config


def enable(model: torch.nn.Module, ulysses_size: int, key: str) -> None:
    """Route the language model's attention through the Ulysses wrapper (checks the head counts first)."""
    config = text_config(model)
    check_heads(config, ulysses_size, key)
    current = config._attn_implementation
    if current in (NAME, FLASH_NAME):
        return
    register()
    flash = current in ("flash_attention_2", prefix_group.FLASH_NAME)  # Ulysses' wrapper routes prefix layouts too
    config._attn_implementation = FLASH_NAME if flash else NAME
    language_model = _language_model(model)
    if language_model is not None and not getattr(language_model, "_easyrl_ulysses_hook", False):
        language_model.register_forward_pre_hook(_slice_language_model_inputs, with_kwargs=True)
        language_model._easyrl_ulysses_hook = True


def _language_model(model: torch.nn.Module) -> torch.nn.Module | None:
    """A VLM's text decoder (``language_model``, which receives the merged embeddings); None for text models."""
    if vision_tower(model) is None:
        return None
    for name, module in model.named_modules():
        if name.split(".")[-1] == "language_model":
            return module
    raise ValueError(f"Ulysses: found no `language_model` in {type(model).__name__} to split the sequence before.")


def _slice_language_model_inputs(module: torch.nn.Module, args: tuple, kwargs: dict):
    """Keep this rank's slice of a VLM's merged row (every rank of the group holds the features of all the row's
    pictures after the tower's gather: they land in the full embeddings first, so each pad gets its own picture's).

    Slices the embeddings, the (4, 1, tokens) 3-D rope positions and, for Qwen3-VL's deepstack, the visual mask and
    the deepstack features of the visual tokens inside the slice."""
    cut = kwargs.pop(SLICE_KWARG, None)
    if cut is None:
        return None
    start, end = cut
    kwargs["inputs_embeds"] = kwargs["inputs_embeds"][:, start:end]
    kwargs["position_ids"] = kwargs["position_ids"][..., start:end]
    visual = kwargs.get("visual_pos_masks")
    if visual is not None:
        before = int(visual[:, :start].sum())
        kwargs["visual_pos_masks"] = visual = visual[:, start:end]
        here = int(visual.sum())
        deepstack = kwargs.get("deepstack_visual_embeds")
        if deepstack is not None:
            kwargs["deepstack_visual_embeds"] = [embeds[before : before + here] for embeds in deepstack]
    return args, kwargs


@functools.cache
def register() -> None:
    """Register the two wrappers (around flash-attn, and around ``attention.varlen_attention_forward``, which serves
    sdpa and PyTorch's varlen kernel) with flash-attn's mask function: a packed row gets no (tokens x tokens) mask."""
    attention.register_wrappers(NAME, FLASH_NAME, ulysses_attention_forward)


# ----------------------------------------------------------------------------------------------------------------------
# collectives with gradients
# ----------------------------------------------------------------------------------------------------------------------
def _all_to_all(x: torch.Tensor, group: dist.ProcessGroup, scatter_dim: int, gather_dim: int) -> torch.Tensor:
    size = dist.get_world_size(group)
    inputs = [chunk.contiguous() for chunk in x.chunk(size, dim=scatter_dim)]
    outputs = [torch.empty_like(inputs[0]) for _ in range(size)]
    dist.all_to_all(outputs, inputs, group=group)
    return torch.cat(outputs, dim=gather_dim)


class _AllToAll(torch.autograd.Function):
    """Scatter ``scatter_dim`` over the group, gather ``gather_dim`` from it; backward is the inverse swap."""

    @staticmethod
    def forward(ctx, x, group, scatter_dim: int, gather_dim: int):
        ctx.group, ctx.scatter_dim, ctx.gather_dim = group, scatter_dim, gather_dim
        return _all_to_all(x, group, scatter_dim, gather_dim)

    @staticmethod
    def backward(ctx, grad):
        return _all_to_all(grad, ctx.group, ctx.gather_dim, ctx.scatter_dim), None, None, None


def all_to_all(x: torch.Tensor, sp: SequenceParallel, scatter_dim: int, gather_dim: int) -> torch.Tensor:
    return _AllToAll.apply(x, sp.group, scatter_dim, gather_dim)


class _GatherRows(torch.autograd.Function):
    """Concatenate every rank's rows (``counts[r]`` rows on rank r) in rank order.

    Backward: every rank computed the same loss from the gathered rows, so the gradient of a row is the SUM over the
    group (the module docstring explains why the sum, not one copy, keeps ``ulysses_size`` k equal to 1)."""

    @staticmethod
    def forward(ctx, local, counts: list[int], rank: int, group):
        ctx.counts, ctx.rank, ctx.group = counts, rank, group
        longest = max(counts)
        padded = local.new_zeros(longest, *local.shape[1:])
        padded[: local.shape[0]] = local
        parts = [torch.empty_like(padded) for _ in counts]
        dist.all_gather(parts, padded.contiguous(), group=group)
        return torch.cat([part[:count] for part, count in zip(parts, counts)])

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous().clone()
        dist.all_reduce(grad, group=ctx.group)
        start = sum(ctx.counts[: ctx.rank])
        return grad[start : start + ctx.counts[ctx.rank]], None, None, None


def gather_rows(local: torch.Tensor, counts: list[int], sp: SequenceParallel) -> torch.Tensor:
    """(counts[sp.rank], ...) on each rank -> (sum(counts), ...) on all, differentiable."""
    return _GatherRows.apply(local, counts, sp.rank, sp.group)


# ----------------------------------------------------------------------------------------------------------------------
# slicing a packed row
# ----------------------------------------------------------------------------------------------------------------------
@dataclass
class PackedSlice:
    """How one packed row is cut over the sp group."""

    padded_tokens: int
    """Length of the row after padding to a multiple of the group size."""
    start: int
    """First token of this rank's slice."""
    end: int
    """One past this rank's last token."""
    keep: torch.Tensor
    """(kept_here,) the kept output positions that fall in this slice, relative to ``start``."""
    counts: list[int]
    """Kept positions on each rank of the group (for the gather)."""
    rows: slice
    """Which of the kept positions (in order) this rank's slice holds."""


def pad_length(tokens: int, size: int) -> int:
    return -(-tokens // size) * size


def plan_slice(total_tokens: int, kept_positions: torch.Tensor, sp: SequenceParallel) -> PackedSlice:
    """Cut a packed row of ``total_tokens`` into the group's slices; ``kept_positions`` (sorted) are the row's
    positions whose outputs are wanted (those predicting response tokens)."""
    padded = pad_length(total_tokens, sp.size)
    width = padded // sp.size
    owner = torch.div(kept_positions, width, rounding_mode="floor")  # (kept,) the rank holding each position
    counts = torch.bincount(owner, minlength=sp.size).tolist()
    start, end = sp.bounds(padded)
    first = sum(counts[: sp.rank])
    rows = slice(first, first + counts[sp.rank])
    return PackedSlice(padded, start, end, kept_positions[rows] - start, counts, rows)


def pad_packed_row(
    input_ids: torch.Tensor,
    position_ids: torch.Tensor,
    cu_seqlens: torch.Tensor | None,
    padded_tokens: int,
    pad_id: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Append a sequence of its own (positions from 0, token ``pad_id``) so the row has ``padded_tokens`` tokens.

    ``input_ids`` (1, total); ``position_ids`` (1, total) or (channels, 1, total); ``cu_seqlens`` None for a
    shared-prefix row (its layout takes the sequence instead). Its outputs are never read, and nothing attends to it:
    it comes last and is its own packed sequence."""
    extra = padded_tokens - input_ids.shape[-1]
    if extra == 0:
        return input_ids, position_ids, cu_seqlens
    ids = torch.cat([input_ids, input_ids.new_full((1, extra), pad_id)], dim=-1)
    ramp = torch.arange(extra, device=position_ids.device, dtype=position_ids.dtype)
    positions = torch.cat([position_ids, ramp.expand(*position_ids.shape[:-1], extra)], dim=-1)
    if cu_seqlens is not None:
        cu_seqlens = torch.cat([cu_seqlens, cu_seqlens[-1:] + extra])
    return ids, positions, cu_seqlens


def cut_packed_row(
    input_ids: torch.Tensor,
    position_ids: torch.Tensor,
    cu_seqlens: torch.Tensor | None,
    kept_positions: torch.Tensor,
    sp: SequenceParallel,
    whole_row: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, PackedSlice, dict]:
    """Pad a packed row to a multiple of the group and keep this rank's slice of its tokens and of the FULL row's
    position ids (the boundaries stay those of the whole row: the attention sees it whole). ``whole_row`` (a VLM,
    which embeds the whole row and puts the vision tower's outputs in place of the pads) keeps the row whole and lets
    the language model's pre-hook (``enable``) cut the embeddings and 3-D positions. Returns the ids, positions and
    boundaries to run, the cut, and the keyword arguments the model is called with besides."""
    cut = plan_slice(input_ids.shape[-1], kept_positions, sp)
    input_ids, position_ids, cu_seqlens = pad_packed_row(input_ids, position_ids, cu_seqlens, cut.padded_tokens, 0)
    extra: dict = {KWARG: sp}  # read by the attention wrapper of every decoder layer
    if whole_row:
        extra[SLICE_KWARG] = (cut.start, cut.end)
    else:
        input_ids = input_ids[..., cut.start : cut.end]
        position_ids = position_ids[..., cut.start : cut.end]
    return input_ids, position_ids, cu_seqlens, cut, extra


# ----------------------------------------------------------------------------------------------------------------------
# the attention function
# ----------------------------------------------------------------------------------------------------------------------
def ulysses_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    *args,
    inner: str | None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """transformers' attention-function signature: (batch, heads, q, dim) -> (batch, q, heads, dim), None.

    With a ``ulysses`` keyword (a ``SequenceParallel``), the inputs hold this rank's slice of the packed row for all
    heads: they are swapped to all tokens for 1/k of the heads, attended with the full row's boundaries, and
    swapped back."""
    sp: SequenceParallel | None = kwargs.pop(KWARG, None)
    function = attention.inner_function(inner)
    if prefix_group.KWARG in kwargs:
        # a shared-prefix row (worker.actor.shared_prefix): after the swap each rank holds the WHOLE row for its heads,
        # so the prefix attention runs on it unchanged (prefix_group.enable leaves this wrapper in place)
        function = functools.partial(prefix_group.prefix_attention_forward, inner=inner)
    causal = kwargs.get("is_causal")
    causal = causal if causal is not None else getattr(module, "is_causal", True)
    if sp is None or not causal:
        return function(module, query, key, value, attention_mask, *args, **kwargs)
    if attention_mask is not None or query.shape[0] != 1:
        raise ValueError("Ulysses attention runs on one packed row without an attention mask (padding_free).")
    if key.shape[1] % sp.size:  # fewer key/value heads than ranks: each is repeated so that every rank gets one
        # (check_heads: k is a multiple of them); rank j's query heads all belong to the group of head j // repeats.
        # The backward of the repeat sums the copies' gradients.
        repeats = sp.size // key.shape[1]
        key, value = key.repeat_interleave(repeats, dim=1), value.repeat_interleave(repeats, dim=1)
    # (1, heads, tokens / k, dim) -> (1, heads / k, tokens, dim)
    query, key, value = (all_to_all(t, sp, scatter_dim=1, gather_dim=2) for t in (query, key, value))
    # position ids of the slice no longer match the gathered row; the boundaries come from cu_seq_lens_q
    kwargs.pop("position_ids", None)
    with _key_value_groups(module, query.shape[1] // key.shape[1]):
        out, _ = function(module, query, key, value, None, *args, **kwargs)  # (1, tokens, heads / k, dim)
    return all_to_all(out, sp, scatter_dim=1, gather_dim=2), None  # (1, tokens / k, heads, dim)


@contextlib.contextmanager
def _key_value_groups(module: torch.nn.Module, groups: int):
    """The layer's ``num_key_value_groups`` (which transformers' sdpa reads to repeat key/value heads) as this rank's
    heads have it, for one call: repeated key/value heads make the groups smaller than the model's."""
    saved = getattr(module, "num_key_value_groups", None)
    if saved is None or saved == groups:
        yield
        return
    module.num_key_value_groups = groups
    try:
        yield
    finally:
        module.num_key_value_groups = saved
