"""Padding-free attention without flash-attn: PyTorch's varlen flash kernel, else one sdpa call per sequence.

transformers runs a packed row (padding-free batches) through flash-attn's varlen kernel when flash-attn is installed
(``flash_attention_2``). Without it, sdpa separates the packed sequences with a (tokens x tokens) block-diagonal mask:
2.5 GB of mask alone for 50k packed tokens, kept for the backward pass of every layer, and work on blocks that are
masked out. This module registers an attention implementation of its own with transformers, ``easyrl_varlen``,
chosen by ``fsdp_utils.attention_implementation`` wherever flash-attn is absent (the CPU included).

The registered function serves every call a model makes, so each call takes the path its inputs allow:
- a packed row (one row, no cache, no padding mask), its sequence boundaries passed by the caller
  (``cu_seq_lens_q``) or read from the restarting position ids: PyTorch's varlen kernel
  (``torch.nn.attention.varlen.varlen_attn``) on CUDA in fp16/bf16; elsewhere (the CPU, fp32) one sdpa call per
  sequence, which computes what the block-diagonal mask would, exactly, without the mask;
- anything else (padded batches, decoding with a cache, a vision tower's per-image calls): sdpa with the padding
  mask turned into a boolean (batch, 1, q, kv) mask. The mask function registered beside it is flash-attn's, so a
  padded batch hands us its 2-D padding mask (or None) and a packed row never builds a (tokens x tokens) mask.
"""

import functools

import torch


NAME = "easyrl_varlen"


def _varlen_attn():
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:  # PyTorch < 2.10
        return None
    return varlen_attn


def varlen_available() -> bool:
    """CUDA and a PyTorch with ``varlen_attn``."""
    return torch.cuda.is_available() and _varlen_attn() is not None


@functools.cache
def register() -> str:
    """Make ``NAME`` a transformers attention implementation (once per process); returns the name."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, flash_attention_mask

    AttentionInterface.register(NAME, varlen_attention_forward)
    AttentionMaskInterface.register(NAME, flash_attention_mask)
    return NAME


def register_wrappers(name: str, flash_name: str, wrapper) -> None:
    """Register an attention wrapper (Ulysses, shared prefixes) twice: ``name`` around ``varlen_attention_forward``
    (sdpa, PyTorch's varlen kernel) and ``flash_name`` around flash-attn's, each with flash-attn's mask function, so
    a packed row never builds a (tokens x tokens) mask. ``wrapper`` takes ``inner=None | "flash_attention_2"``."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, flash_attention_mask

    AttentionInterface.register(name, functools.partial(wrapper, inner=None))
    AttentionInterface.register(flash_name, functools.partial(wrapper, inner="flash_attention_2"))
    AttentionMaskInterface.register(name, flash_attention_mask)
    AttentionMaskInterface.register(flash_name, flash_attention_mask)


def inner_function(inner: str | None):
    """The attention a wrapper registered by ``register_wrappers`` delegates to."""
    if inner is None:
        return varlen_attention_forward
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    return ALL_ATTENTION_FUNCTIONS[inner]


def packed_attention_kwargs(cu_seqlens: torch.Tensor, max_seqlen: int) -> dict:
    """Keyword arguments that carry a packed row's sequence boundaries to the attention of every layer.

    The names are transformers' flash-attention keywords, so flash_attention_2 takes them too (and skips deriving
    the boundaries from the position ids in every layer, which costs a device sync each).
    """
    return {
        "cu_seq_lens_q": cu_seqlens,
        "cu_seq_lens_k": cu_seqlens,
        "max_length_q": max_seqlen,
        "max_length_k": max_seqlen,
    }


def _boundaries_from_position_ids(position_ids: torch.Tensor) -> tuple[torch.Tensor, int]:
    """(1, tokens) position ids restarting at 0 per sequence -> cu_seqlens (n + 1,) int32 and the longest length."""
    flat = position_ids.reshape(-1)
    starts = (flat == 0).nonzero().flatten()
    if starts.numel() == 0 or int(starts[0]) != 0:
        starts = torch.cat([starts.new_zeros(1), starts])
    ends = torch.cat([starts, starts.new_tensor([flat.numel()])])
    cu_seqlens = ends.to(torch.int32)
    return cu_seqlens, int((ends[1:] - ends[:-1]).max())


def _packed_boundaries(query: torch.Tensor, key: torch.Tensor, attention_mask, kwargs: dict, causal: bool):
    """(cu_seqlens, max_seqlen) when this call is one packed row, else None."""
    if attention_mask is not None or query.shape[0] != 1 or query.shape[2] != key.shape[2]:
        return None
    cu_seqlens = kwargs.get("cu_seq_lens_q")
    # a causal (text) call takes the caller's boundaries; a bidirectional one (a vision tower, which may see the
    # text's keyword arguments passed along) keeps to its own
    if cu_seqlens is not None and causal:
        if int(kwargs.get("max_length_q") or 0) <= 0:
            raise ValueError("cu_seq_lens_q was given without max_length_q (the longest packed sequence).")
        return cu_seqlens.to(device=query.device, dtype=torch.int32), int(kwargs["max_length_q"])
    position_ids = kwargs.get("position_ids")
    if position_ids is None or position_ids.dim() != 2 or position_ids.shape[-1] != query.shape[2]:
        return None
    return _boundaries_from_position_ids(position_ids.to(query.device))


def _dense_mask(
    query: torch.Tensor, key: torch.Tensor, padding_mask: torch.Tensor | None, causal: bool
) -> torch.Tensor | None:
    """A 2-D padding mask (batch, kv) -> boolean (batch, 1, q, kv), causal with the queries at the end of the keys."""
    if padding_mask is None or padding_mask.dim() != 2:
        return padding_mask
    q_len, kv_len = query.shape[2], key.shape[2]
    mask = padding_mask.to(device=query.device, dtype=torch.bool)[:, None, None, :].expand(-1, 1, q_len, -1)
    if causal:
        allowed = torch.ones(q_len, kv_len, dtype=torch.bool, device=query.device).tril(kv_len - q_len)
        mask = mask & allowed
    # a query that may see nothing (a left-padding position) would give NaN, and NaN spreads through the values of
    # later layers even where masked; let it see everything: its output is padding and never read
    return mask | ~mask.any(-1, keepdim=True)


def varlen_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """transformers' attention-function signature: (batch, heads, q, dim) inputs -> (batch, q, heads, dim), None."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    packed = _packed_boundaries(query, key, attention_mask, kwargs, causal)
    for name in ("cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k", "position_ids"):
        kwargs.pop(name, None)
    if packed is None:
        mask = _dense_mask(query, key, attention_mask, causal)
        return sdpa_attention_forward(module, query, key, value, mask, dropout, scaling, is_causal=causal, **kwargs)
    cu_seqlens, max_seqlen = packed
    varlen_attn = _varlen_attn()
    if varlen_attn is None or not query.is_cuda or query.dtype not in (torch.float16, torch.bfloat16) or dropout:
        return _per_sequence_attention(module, query, key, value, cu_seqlens, dropout, scaling, causal, **kwargs), None
    q, k, v = (t[0].transpose(0, 1) for t in (query, key, value))  # (tokens, heads, dim)
    names = _varlen_signature()
    options = {}
    if "is_causal" in names:
        options["is_causal"] = causal
    elif "window_size" in names:
        options["window_size"] = (-1, 0) if causal else (-1, -1)
    elif not causal:
        raise RuntimeError("This PyTorch's varlen_attn has no non-causal mode; install flash-attn for this model.")
    if scaling is not None:
        if "scale" in names:
            options["scale"] = scaling
        else:  # the kernel scales by 1/sqrt(dim): fold the difference into the queries
            q = q * (scaling * q.shape[-1] ** 0.5)
    if k.shape[1] != q.shape[1]:  # grouped-query attention: one key/value head per group of query heads
        if "enable_gqa" in names:
            options["enable_gqa"] = True
        else:
            groups = q.shape[1] // k.shape[1]
            k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    out = varlen_attn(q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen, **options)
    return out.unsqueeze(0), None


def _per_sequence_attention(
    module, query, key, value, cu_seqlens: torch.Tensor, dropout: float, scaling, causal: bool, **kwargs
) -> torch.Tensor:
    """One sdpa call per packed sequence: (1, heads, tokens, dim) -> (1, tokens, heads, dim).

    Each sequence attends within itself, as the block-diagonal mask would have it, without building that (tokens x
    tokens) mask or computing the blocks it masks out: the work is the sum of the squared lengths instead of the
    square of their sum (16 sequences of 256 tokens: 1/16 of the attention FLOPs and no 16M-entry mask per layer)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    bounds = cu_seqlens.tolist()
    outputs = [
        sdpa_attention_forward(
            module,
            query[:, :, start:end],
            key[:, :, start:end],
            value[:, :, start:end],
            None,
            dropout,
            scaling,
            is_causal=causal,
            **kwargs,
        )[0]
        for start, end in zip(bounds[:-1], bounds[1:])
        if end > start
    ]
    return outputs[0] if len(outputs) == 1 else torch.cat(outputs, dim=1)


@functools.cache
def _varlen_signature() -> frozenset:
    import inspect

    return frozenset(inspect.signature(_varlen_attn()).parameters)
