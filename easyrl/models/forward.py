"""One forward pass of a (possibly FSDP-wrapped) Hugging Face model, reduced to the outputs at response tokens.

The actor needs the logits that predict each response token, the critic the value at the same positions. Both get
them here as a compact (valid_tokens, ...) tensor, from either the padded batch or its padding-free packing, and
put them back into (batch, response_len) with ``scatter_to_response``.
"""

import inspect
from typing import TYPE_CHECKING

import torch

from .padding_free import pack_batch, response_prediction_positions
from .vision import multi_modal_model_inputs, packed_mrope_position_ids


if TYPE_CHECKING:
    from ..protocol import DataProto


def _accepts_logits_to_keep(module: torch.nn.Module) -> bool:
    # FSDP2 wraps by subclassing, so the original forward signature is still visible on the type
    return "logits_to_keep" in inspect.signature(type(module).forward).parameters


def extra_model_inputs(data: "DataProto", processor=None) -> dict:
    """Model inputs beyond token ids and positions: pixel values and grid sizes of the images/videos of exactly
    these samples (VLMs); text batches need none."""
    return multi_modal_model_inputs(data, processor)


def forward_response_outputs(
    module: torch.nn.Module, data: "DataProto", padding_free: bool, lm_logits: bool, processor=None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Outputs (``.logits`` of the model) at the positions that predict each existing response token.

    Returns ``outputs`` (valid_tokens, ...) in row-major order and ``valid`` (batch, response_len) bool.
    ``lm_logits`` asks causal LMs for logits at those positions only (``logits_to_keep``), so the vocabulary
    projection never runs on prompt tokens. ``processor`` (VLMs) turns the samples' images/videos into pixel inputs.
    """
    batch = data.batch
    input_ids, attention_mask, position_ids = batch["input_ids"], batch["attention_mask"], batch["position_ids"]
    response_length = batch["responses"].shape[-1]
    extra = extra_model_inputs(data, processor)
    keep_supported = lm_logits and _accepts_logits_to_keep(module)
    if padding_free:
        packed = pack_batch(input_ids, attention_mask, position_ids)
        packed_positions = packed.position_ids
        if position_ids.dim() == 3:  # 3-D rope: (3, 1, total) -> (4, 1, total) with the restarting text row first
            packed_positions = packed_mrope_position_ids(packed_positions, attention_mask.sum(-1))
        valid, positions = response_prediction_positions(attention_mask, response_length)
        kwargs = {"logits_to_keep": positions} if keep_supported else {}
        # no attention mask: transformers separates the packed sequences by their restarting position ids
        out = module(input_ids=packed.input_ids, position_ids=packed_positions, use_cache=False, **kwargs, **extra)
        logits = out.logits[0]  # (kept or total_tokens, ...)
        return (logits if keep_supported else logits[positions]), valid

    valid = attention_mask[:, -response_length:].bool()  # (batch, response_len)
    kwargs = {"logits_to_keep": response_length + 1} if keep_supported else {}
    if position_ids.dim() == 3:  # (batch, 3, seq) -> (3, batch, seq), the layout Qwen-VL models take
        position_ids = position_ids.transpose(0, 1)
    out = module(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids,
        use_cache=False,
        **kwargs,
        **extra,
    )
    logits = out.logits[:, -response_length - 1 : -1]  # (batch, response_len, ...): position t predicts token t + 1
    return logits[valid], valid


def scatter_to_response(values: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """(valid_tokens,) -> (batch, response_len) with zeros where the response has no token (keeps autograd)."""
    out = values.new_zeros(valid.shape)
    out[valid] = values
    return out
