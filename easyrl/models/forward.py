"""One forward pass of a (possibly FSDP-wrapped) Hugging Face model, reduced to the outputs at response tokens.

The actor needs the logits that predict each response token, the critic the value at the same positions. Both get
them here as a compact (valid_tokens, ...) tensor, from either the padded batch or its padding-free packing, and
put them back into (batch, response_len) with ``scatter_to_response``.
"""

import inspect
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from . import prefix_group, ulysses
from .attention import packed_attention_kwargs
from .fused_head import FusedHeadRequest, run_with_fused_head
from .padding_free import pack_batch, response_prediction_positions
from .vision import (
    MULTI_MODAL_KEY,
    append_blank_row,
    append_blank_sequence,
    build_vision_inputs,
    packed_mrope_position_ids,
    require_processor,
    vision_tower,
)
from .vision_encoder import micro_batch as vision_micro_batch


if TYPE_CHECKING:
    from ..protocol import DataProto

# per_token(outputs of some valid tokens (n, ...), which valid tokens (a slice of the row-major order)) -> (n, ...)
PerToken = Callable[[torch.Tensor, slice], torch.Tensor]


def _accepts_logits_to_keep(module: torch.nn.Module) -> bool:
    # FSDP2 wraps by subclassing, so the original forward signature is still visible on the type; a peft wrapper
    # (models/lora.py) passes every argument on to the model it wraps
    if hasattr(type(module), "get_base_model"):
        module = module.get_base_model()
    return "logits_to_keep" in inspect.signature(type(module).forward).parameters


def forward_response_outputs(
    module: torch.nn.Module,
    data: "DataProto",
    padding_free: bool,
    lm_logits: bool,
    processor=None,
    fused: FusedHeadRequest | None = None,
    per_token: PerToken | None = None,
    sp: ulysses.SequenceParallel | None = None,
    shared_prefix: prefix_group.PrefixStats | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Outputs (``.logits`` of the model) at the positions that predict each existing response token.

    Returns ``outputs`` (valid_tokens, ...) in row-major order and ``valid`` (batch, response_len) bool.
    ``lm_logits`` asks causal LMs for logits at those positions only (``logits_to_keep``), so the vocabulary
    projection never runs on prompt tokens. ``processor`` (VLMs) turns the samples' images/videos into pixel inputs.
    ``fused`` (`worker.actor.model.use_fused_kernels`) has the LM head return the response tokens' log-probs (and
    entropies) instead of logits (models/fused_head.py): ``outputs`` is then (valid_tokens, 1 or 2) fp32.
    ``per_token(outputs, rows)`` reduces the outputs of the valid tokens ``rows`` (a slice of the row-major order)
    to what the caller keeps (log-probs and entropies instead of vocabulary logits); ``outputs`` is then its result.
    ``sp`` (Ulysses, models/ulysses.py): this rank computes its slice of the packed row and the per-token results
    are gathered from the group, so every rank of it returns the whole micro-batch's outputs.
    ``shared_prefix`` (`worker.actor.shared_prefix`, models/prefix_group.py): pack each group of samples with the same
    prompt as one prompt followed by its responses (the prompt runs once); what sharing did is added to it.
    """
    batch = data.batch
    input_ids, attention_mask, position_ids = batch["input_ids"], batch["attention_mask"], batch["position_ids"]
    responses = batch["responses"]
    batch_size, response_length = input_ids.shape[0], responses.shape[-1]
    rows = data.non_tensor_batch.get(MULTI_MODAL_KEY)
    require_processor(rows, processor)
    vision = None
    groups = None
    unsort = None  # a shared-prefix row cut by Ulysses: the gathered outputs, in packed order, back to row-major
    if shared_prefix is not None:
        if not padding_free:
            raise ValueError(
                "`worker.actor.shared_prefix` packs each prompt once in a padding-free row: it needs "
                "worker.actor.padding_free=true."
            )
        alone = None
        if processor is not None and vision_tower(module) is not None:
            alone = prefix_group.responses_with_vision_pads(input_ids, response_length, processor)
        groups, unshared = prefix_group.find_groups(input_ids, attention_mask, response_length, rows, alone)
        shared_prefix.unshared_rows += unshared
    if processor is not None and vision_tower(module) is not None:
        if groups is None:
            vision = build_vision_inputs(
                input_ids, attention_mask, rows, processor, response_length, batch.get("response_mask", None)
            )
            input_ids = vision.input_ids
        else:  # the pictures of each group's prompt once (its first sample's), in packed order
            vision, input_ids = prefix_group.group_vision_inputs(
                input_ids, attention_mask, rows, processor, response_length, groups
            )
        if position_ids.dim() == 2:  # text positions on all three rope axes
            position_ids = position_ids[:, None, :].expand(-1, 3, -1)
    extra = {"pixel_values": vision.pixel_values, "image_grid_thw": vision.image_grid_thw} if vision else {}
    blank_tokens = vision.blank_tokens if vision else 0
    keep_supported = lm_logits and _accepts_logits_to_keep(module)
    if fused is not None and not keep_supported:
        raise ValueError(
            f"`worker.actor.model.use_fused_kernels` needs a causal LM whose forward takes `logits_to_keep`; "
            f"{type(module).__name__}'s does not. Set worker.actor.model.use_fused_kernels=false for this model."
        )
    if groups is not None:
        grouped = prefix_group.pack_groups(input_ids, attention_mask, position_ids, response_length, groups)
        layout = grouped.layout
        packed_ids, packed_positions = grouped.input_ids, grouped.position_ids
        if blank_tokens:
            packed_ids, packed_positions = append_blank_sequence(
                packed_ids, packed_positions, blank_tokens, vision.image_token_id
            )
            layout = layout.with_extra_sequence(blank_tokens)
        valid, positions = grouped.valid.to(input_ids.device), grouped.positions
        keep, rows = positions, slice(None)
        shared_prefix.samples += batch_size
        shared_prefix.groups += grouped.groups
        shared_prefix.tokens += packed_ids.shape[-1] - blank_tokens
        shared_prefix.unshared_tokens += grouped.unshared_tokens
        extra_inputs = {}
        if sp is not None:
            # as the padding-free row below, with the padding a sequence of the layout; Ulysses cuts the row by packed
            # position, and the outputs a group's samples read are not in that order (a response's first token is
            # read at its prompt's end): this rank keeps its positions in packed order
            order = torch.argsort(positions)
            unpadded = packed_ids.shape[-1]
            packed_ids, packed_positions, _, cut, extra_inputs = ulysses.cut_packed_row(
                packed_ids, packed_positions, None, positions[order], sp, whole_row=vision is not None
            )
            if cut.padded_tokens > unpadded:
                layout = layout.with_extra_sequence(cut.padded_tokens - unpadded)
            positions, keep, rows = cut.keep, cut.keep, order[cut.rows]
            unsort = torch.argsort(order)
        inputs = {
            "input_ids": packed_ids,
            "position_ids": packed_positions,
            prefix_group.KWARG: layout,
            **extra_inputs,
        }
        kept_labels = responses[valid][rows][None] if fused is not None else None
    elif padding_free:
        packed = pack_batch(input_ids, attention_mask, position_ids)
        packed_ids, packed_positions = packed.input_ids, packed.position_ids
        if position_ids.dim() == 3:  # 3-D rope: (3, 1, total) -> (4, 1, total) with the restarting text row first
            packed_positions = packed_mrope_position_ids(packed_positions, attention_mask.sum(-1))
        cu_seqlens, max_seqlen = packed.cu_seqlens, packed.max_seqlen
        if blank_tokens:
            packed_ids, packed_positions = append_blank_sequence(
                packed_ids, packed_positions, blank_tokens, vision.image_token_id
            )
            cu_seqlens = torch.cat([cu_seqlens, cu_seqlens[-1:] + blank_tokens])
            max_seqlen = max(max_seqlen, blank_tokens)
        valid, positions = response_prediction_positions(attention_mask, response_length)
        keep = positions
        rows = slice(None)
        extra_inputs = {}
        if sp is not None:
            unpadded = packed_ids.shape[-1]
            packed_ids, packed_positions, cu_seqlens, cut, extra_inputs = ulysses.cut_packed_row(
                packed_ids, packed_positions, cu_seqlens, positions, sp, whole_row=vision is not None
            )
            max_seqlen = max(max_seqlen, cut.padded_tokens - unpadded)
            positions, keep, rows = cut.keep, cut.keep, cut.rows
        # no attention mask: the sequence boundaries go to the attention kernels (varlen), which would otherwise
        # read them from the restarting position ids in every layer
        inputs = {
            "input_ids": packed_ids,
            "position_ids": packed_positions,
            **packed_attention_kwargs(cu_seqlens.to(packed_ids.device), max_seqlen),
            **extra_inputs,
        }
        # (1, kept): the i-th kept position predicts the i-th valid response token
        kept_labels = responses[valid][rows][None] if fused is not None else None
    else:
        if sp is not None:
            raise ValueError("Ulysses sequence parallelism needs padding_free=true for the role that uses it.")
        rows = slice(None)
        valid = attention_mask[:, -response_length:].bool()  # (batch, response_len)
        keep = response_length + 1
        if position_ids.dim() == 3:  # (batch, 3, seq) -> (3, batch, seq), the layout Qwen-VL models take
            position_ids = position_ids.transpose(0, 1)
        if blank_tokens:
            input_ids, attention_mask, position_ids = append_blank_row(
                input_ids, attention_mask, position_ids, blank_tokens, vision.image_token_id
            )
        inputs = {"input_ids": input_ids, "attention_mask": attention_mask, "position_ids": position_ids}
        # (rows, response_len + 1): kept column t predicts responses[:, t]; the last column and the blank row, if
        # any, predict nothing (label 0, dropped below)
        kept_labels = F.pad(responses, (0, 1, 0, input_ids.shape[0] - batch_size)) if fused is not None else None
    kwargs = {"logits_to_keep": keep} if keep_supported else {}

    def run_model():
        return module(**inputs, use_cache=False, **kwargs, **extra)

    # the tower call: shared over the Ulysses group, served from the frozen tower's cache (models/vision_encoder.py)
    with vision_micro_batch(module, vision, sp):
        logits = run_model().logits if fused is None else run_with_fused_head(module, kept_labels, fused, run_model)
    if padding_free:
        logits = logits[0]  # (kept or total_tokens, ...)
        outputs = logits if keep_supported else logits[positions]
    else:
        # (batch, response_len, ...): position t predicts token t + 1 (the blank row, if any, is dropped)
        outputs = logits[:batch_size, -response_length - 1 : -1][valid]
    if per_token is not None:
        outputs = per_token(outputs, rows)
    if sp is not None:
        outputs = ulysses.gather_rows(outputs, cut.counts, sp)
    if unsort is not None:
        outputs = outputs[unsort]
    return outputs, valid


def scatter_to_response(values: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """(valid_tokens,) -> (batch, response_len) with zeros where the response has no token (keeps autograd)."""
    out = values.new_zeros(valid.shape)
    out[valid] = values
    return out
