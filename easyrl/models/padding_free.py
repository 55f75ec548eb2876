"""Padding-free packing: run a batch as ONE row of real tokens, so no compute is spent on padding.

A padded batch (batch, seq) with left-padded prompts and right-padded responses becomes (1, total_tokens) with
position ids restarting at 0 for every sequence. Attention must not cross sequences; transformers derives that
from the restarting position ids when no attention mask is passed:
- on GPU with flash_attention_2 it calls the varlen kernel with cu_seqlens taken from the position ids;
- with sdpa (CPU) it builds an exact block-diagonal causal mask from them.
Either way the result equals the padded forward pass (fp32: within float rounding).
"""

from dataclasses import dataclass

import torch


@dataclass
class PackedBatch:
    input_ids: torch.Tensor
    """(1, total_tokens) the real tokens of every row, back to back."""
    position_ids: torch.Tensor
    """(1, total_tokens), or (channels, 1, total_tokens) for multi-axis (mrope) position ids."""
    indices: torch.Tensor
    """(total_tokens,) where each packed token sits in the flattened (batch * seq) padded layout."""
    cu_seqlens: torch.Tensor
    """(batch + 1,) int32 cumulative sequence lengths (the varlen-attention convention)."""
    max_seqlen: int
    """Length of the longest sequence."""


def pack_batch(input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor) -> PackedBatch:
    """(batch, seq) tensors (position ids (batch, seq) or (batch, channels, seq)) -> one packed row."""
    batch, seq = input_ids.shape
    indices = attention_mask.reshape(-1).nonzero(as_tuple=True)[0]  # (total_tokens,)
    seqlens = attention_mask.sum(-1, dtype=torch.int32)  # (batch,)
    cu_seqlens = torch.nn.functional.pad(seqlens.cumsum(0, dtype=torch.int32), (1, 0))
    packed_ids = input_ids.reshape(-1)[indices].unsqueeze(0)
    if position_ids.dim() == 3:  # (batch, channels, seq) -> (channels, 1, total_tokens)
        channels = position_ids.shape[1]
        packed_pos = position_ids.transpose(0, 1).reshape(channels, batch * seq)[:, indices].unsqueeze(1)
    else:
        packed_pos = position_ids.reshape(-1)[indices].unsqueeze(0)
    return PackedBatch(packed_ids, packed_pos, indices, cu_seqlens, int(seqlens.max().item()) if batch else 0)


def unpack(values: torch.Tensor, indices: torch.Tensor, batch: int, seq: int) -> torch.Tensor:
    """(total_tokens, ...) packed values -> (batch, seq, ...) with zeros at padding positions."""
    out = values.new_zeros(batch * seq, *values.shape[1:])
    out[indices] = values
    return out.view(batch, seq, *values.shape[1:])


def response_prediction_positions(
    attention_mask: torch.Tensor, response_length: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Where the outputs that predict (or value) each response token live in the packed row.

    The response occupies the last ``response_length`` columns (right-padded); response token r of row i is
    predicted by the output at column ``seq - response_length + r - 1``. Returns ``valid`` (batch, response_len)
    bool, true where the response token exists, and ``positions`` (valid.sum(),) the packed index of the
    predicting output for each valid token in row-major order.
    """
    batch, seq = attention_mask.shape
    valid = attention_mask[:, -response_length:].bool()  # (batch, response_len)
    packed_index = attention_mask.reshape(-1).long().cumsum(0) - 1  # (batch * seq,) packed index of real tokens
    columns = torch.arange(seq - response_length - 1, seq - 1, device=attention_mask.device)  # (response_len,)
    flat = torch.arange(batch, device=attention_mask.device)[:, None] * seq + columns[None, :]
    return valid, packed_index[flat[valid]]
