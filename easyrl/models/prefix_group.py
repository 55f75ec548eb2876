"""Shared-prefix forward passes (Prefix Grouper, arXiv 2506.05433): the n samples of a prompt compute it once.

GRPO samples n responses per prompt, and a plain packed row holds the prompt n times, so the log-prob and update
passes run its tokens (for a VLM: its pictures, through the vision tower too) n times. Here a micro-batch is packed
as, for each group of samples with the same prompt, ONE copy of the prompt followed by the group's responses:

    [prompt_1, response_1_1, ..., response_1_n, prompt_2, response_2_1, ...]

with attention such that the prompt attends causally to itself and each response to [its prompt ; itself] (causal
within itself), and position ids of each response continuing from its prompt (the ids the batch already carries).
Each token then sees exactly the keys and values it sees in its own unshared sequence, at the same positions, so
log-probs, entropies and gradients equal the unshared path's (up to float rounding): the per-token layers (norms,
MLPs, projections, the vision tower) run once per prompt token instead of n times; autograd sums the prompt's
gradient over the group's responses, which is what the n unshared copies would have added up.

Attention per layer (``prefix_attention_forward``): one causal call over each prompt, and for each response one
call of its queries over its prompt's keys/values concatenated with its own, with a small (response x (prompt +
response)) mask, or, for a response at least as long as its prompt, with the prompt's queries in front and sdpa's
own causal mask instead (no mask to keep for the backward pass). It runs on sdpa (any device, any dtype): no (tokens
x tokens) mask is built and no kernel beyond sdpa is needed. The attention function is registered with transformers the way ``ulysses.py`` registers its own: it
takes the shared-prefix path only for calls carrying a ``prefix_layout`` keyword argument (the packed forward of
``forward.py`` passes it through the model); any other call goes to the wrapped implementation.

The response's first token is predicted by the prompt's last position, which all responses of the group share: that
output is read once per response (its logits row is repeated, the gradients of the copies add up).

Groups are found, not assumed: rows of a micro-batch share a prompt only when their prompt token ids are identical
and their pictures/videos are the same objects or equal. Micro-batches are cut by whole groups
(``split_micro_batches_by_group``); a group larger than a micro-batch is cut into parts that each share the prompt
among their own samples (counted in ``PrefixStats.split_groups``).
"""

import functools
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from . import attention
from .dynamic_batching import balanced_partitions, max_over_ranks, split_micro_batches
from .vision import MULTI_MODAL_KEY, VisionInputs, build_vision_inputs


if TYPE_CHECKING:
    from ..protocol import DataProto


NAME = "easyrl_prefix"
FLASH_NAME = "easyrl_prefix_flash"
KWARG = "prefix_layout"


# ----------------------------------------------------------------------------------------------------------------------
# counts
# ----------------------------------------------------------------------------------------------------------------------
@dataclass
class PrefixStats:
    """What sharing did, summed over the forward passes that used it (reported as ``actor/shared_prefix/*`` and
    ``critic/shared_prefix/*``)."""

    samples: int = 0
    """Samples run through the shared-prefix path."""
    groups: int = 0
    """Prompt copies computed (one per group part in a micro-batch)."""
    tokens: int = 0
    """Tokens run (each shared prompt once)."""
    unshared_tokens: int = 0
    """Tokens the unshared packing would have run (each sample's prompt and response)."""
    split_groups: int = 0
    """Groups cut over several micro-batches (each part computes the prompt once)."""
    unshared_rows: int = 0
    """Rows with the prompt ids of another row of their micro-batch not shared with it: other pictures/videos, or
    vision pads in the response (see ``responses_with_vision_pads``)."""

    def metrics(self, prefix: str) -> dict[str, float]:
        ratio = self.tokens / self.unshared_tokens if self.unshared_tokens else 1.0
        return {
            f"{prefix}/shared_prefix/token_ratio": ratio,
            f"{prefix}/shared_prefix/samples_per_prompt": self.samples / max(self.groups, 1),
            f"{prefix}/shared_prefix/split_groups": float(self.split_groups),
            f"{prefix}/shared_prefix/unshared_rows": float(self.unshared_rows),
        }


# ----------------------------------------------------------------------------------------------------------------------
# finding the groups
# ----------------------------------------------------------------------------------------------------------------------
def _same_media(a: Any, b: Any) -> bool:
    """Two rows' ``multi_modal_data`` hold the same pictures/videos (the n samples of a prompt share the objects;
    equal copies, e.g. after shipping between processes, count as the same)."""
    if a is b:
        return True
    if not a or not b:
        return not a and not b
    for key in ("images", "videos"):
        items_a, items_b = list(a.get(key) or []), list(b.get(key) or [])
        if len(items_a) != len(items_b):
            return False
        for x, y in zip(items_a, items_b):
            if x is y:
                continue
            if isinstance(x, torch.Tensor) or isinstance(y, torch.Tensor):
                if not (isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor) and torch.equal(x, y)):
                    return False
            elif x != y:  # PIL images compare mode, size and pixels
                return False
    return True


def find_groups(
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    response_length: int,
    rows: Sequence | None = None,
    alone: torch.Tensor | None = None,
) -> tuple[list[list[int]], int]:
    """Rows with identical prompts, as index lists in order of first appearance (members ascending), and the count
    of rows left unshared although their prompt ids matched an earlier row's: other pictures/videos, or marked
    ``alone``.

    ``input_ids``/``attention_mask`` (batch, seq) with the prompt in the first ``seq - response_length`` columns;
    ``rows`` the rows' ``multi_modal_data`` (None for text); ``alone`` (batch,) bool: rows that get a group of their
    own (a VLM response holding vision pads)."""
    prompt_columns = input_ids.shape[-1] - response_length
    # one copy to the host: reading each row's prompt from a GPU tensor would sync once per row
    input_ids, attention_mask = input_ids[:, :prompt_columns].cpu(), attention_mask[:, :prompt_columns].cpu()
    alone = alone.cpu() if alone is not None else None
    by_prompt: dict[tuple[int, ...], list[list[int]]] = {}
    groups: list[list[int]] = []
    unshared = 0
    for i in range(input_ids.shape[0]):
        mask = attention_mask[i, :prompt_columns].bool()
        key = tuple(input_ids[i, :prompt_columns][mask].tolist())
        candidates = by_prompt.setdefault(key, [])
        media = rows[i] if rows is not None else None
        single = alone is not None and bool(alone[i])
        for group in candidates:
            leader_alone = alone is not None and bool(alone[group[0]])
            if not single and not leader_alone and _same_media(rows[group[0]] if rows is not None else None, media):
                group.append(i)
                break
        else:
            unshared += bool(candidates)
            group = [i]
            candidates.append(group)
            groups.append(group)
    return groups, unshared


# ----------------------------------------------------------------------------------------------------------------------
# the packed row
# ----------------------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Segment:
    """Queries ``[start, end)`` of the packed row attend to keys ``[prefix_start, prefix_end)`` (their prompt; empty
    for a prompt) followed by their own keys, causally."""

    start: int
    end: int
    prefix_start: int = 0
    prefix_end: int = 0


@dataclass
class PrefixLayout:
    """The attention pattern of one packed row (passed to every layer as the ``prefix_layout`` keyword)."""

    segments: list[Segment]
    _cache: dict = field(default_factory=dict, repr=False)

    def mask(self, queries: int, prefix: int, device: torch.device) -> torch.Tensor:
        """(1, 1, queries, prefix + queries) bool: the whole prefix, then causal over the segment's own keys."""
        key = (queries, prefix, device)
        if key not in self._cache:
            own = torch.ones(queries, queries, dtype=torch.bool, device=device).tril()
            full = torch.ones(queries, prefix, dtype=torch.bool, device=device)
            self._cache[key] = torch.cat([full, own], dim=1)[None, None]
        return self._cache[key]

    def varlen_plan(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int, int]:
        """For one variable-length attention call over all segments: (key_index (keys,) long: the packed positions of
        each segment's keys, its prompt's then its own; cu_q, cu_k (segments + 1,) int32; max_q; max_k)."""
        key = ("varlen", device)
        if key not in self._cache:
            index = [
                torch.cat([torch.arange(s.prefix_start, s.prefix_end), torch.arange(s.start, s.end)])
                for s in self.segments
            ]
            q_lengths = torch.tensor([s.end - s.start for s in self.segments])
            k_lengths = torch.tensor([len(i) for i in index])
            cu_q = torch.nn.functional.pad(q_lengths.cumsum(0), (1, 0)).to(device, torch.int32)
            cu_k = torch.nn.functional.pad(k_lengths.cumsum(0), (1, 0)).to(device, torch.int32)
            plan = (torch.cat(index).to(device), cu_q, cu_k, int(q_lengths.max()), int(k_lengths.max()))
            self._cache[key] = plan
        return self._cache[key]

    def with_extra_sequence(self, tokens: int) -> "PrefixLayout":
        """The layout with a sequence of its own appended (a VLM's blank picture, see ``vision.py``)."""
        end = self.segments[-1].end if self.segments else 0
        return PrefixLayout([*self.segments, Segment(end, end + tokens)])


@dataclass
class GroupedPack:
    """One micro-batch packed with one prompt copy per group."""

    input_ids: torch.Tensor
    """(1, tokens)."""
    position_ids: torch.Tensor
    """(1, tokens), or (channels, 1, tokens) for multi-axis (mrope) positions: each token's id in its unshared row."""
    layout: PrefixLayout
    valid: torch.Tensor
    """(batch, response_len) bool: the response token exists."""
    positions: torch.Tensor
    """(valid.sum(),) packed index of the output predicting each valid response token, in row-major order."""
    groups: int
    unshared_tokens: int


def pack_groups(
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    position_ids: torch.Tensor,
    response_length: int,
    groups: list[list[int]],
) -> GroupedPack:
    """Pack (batch, seq) left-padded prompts ++ right-padded responses as [prompt, its responses] per group.

    ``position_ids`` (batch, seq) or (batch, channels, seq); each token keeps its id from its own row, so a response's
    positions continue from its prompt exactly as in the unshared row. A prompt with no token is refused: nothing
    would predict its response's first token."""
    batch, seq = input_ids.shape
    prompt_columns = seq - response_length
    device = input_ids.device
    attention_mask = attention_mask.cpu()  # the layout is planned on the host, then indexes the device once
    valid = attention_mask[:, prompt_columns:].bool()  # (batch, response_len)
    lengths = valid.sum(-1).tolist()
    predicting = torch.zeros(batch, response_length, dtype=torch.long)
    flat_index: list[torch.Tensor] = []  # indices into the flattened (batch * seq) layout, in packed order
    segments: list[Segment] = []
    cursor = 0
    for group in groups:
        leader = group[0]
        prompt = attention_mask[leader, :prompt_columns].nonzero().flatten().cpu()
        if prompt.numel() == 0:
            raise ValueError(f"Sample {leader} of the micro-batch has an empty prompt: nothing predicts its response.")
        flat_index.append(leader * seq + prompt)
        prompt_start, prompt_end = cursor, cursor + prompt.numel()
        segments.append(Segment(prompt_start, prompt_end))
        cursor = prompt_end
        for member in group:
            length = int(lengths[member])
            flat_index.append(member * seq + prompt_columns + torch.arange(length))
            segments.append(Segment(cursor, cursor + length, prompt_start, prompt_end))
            if length:
                # token 0 is predicted by the prompt's last position, token r by the response's position r - 1
                predicting[member, 0] = prompt_end - 1
                predicting[member, 1:length] = torch.arange(cursor, cursor + length - 1)
            cursor += length
    index = torch.cat(flat_index).to(device)
    packed_ids = input_ids.reshape(-1)[index][None]
    if position_ids.dim() == 3:  # (batch, channels, seq) -> (channels, 1, tokens)
        channels = position_ids.shape[1]
        packed_positions = position_ids.transpose(0, 1).reshape(channels, batch * seq)[:, index][:, None]
    else:
        packed_positions = position_ids.reshape(-1)[index][None]
    segments = [s for s in segments if s.end > s.start]
    positions = predicting[valid].to(device)
    return GroupedPack(
        packed_ids,
        packed_positions,
        PrefixLayout(segments),
        valid,
        positions,
        len(groups),
        int(attention_mask.sum()),
    )


def responses_with_vision_pads(input_ids: torch.Tensor, response_length: int, processor: Any) -> torch.Tensor:
    """(batch,) bool: the response holds an image/video pad (sampled by the policy, or a multi-turn tool's picture).
    Such a row is its own group: ``build_vision_inputs`` reads its pads, which the group's first row cannot stand
    for."""
    responses = input_ids[:, -response_length:]
    return ((responses == processor.image_token_id) | (responses == processor.video_token_id)).any(-1)


def group_vision_inputs(
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    rows: Sequence | None,
    processor: Any,
    response_length: int,
    groups: list[list[int]],
) -> tuple[VisionInputs, torch.Tensor]:
    """A VLM micro-batch's pixel inputs with each group's pictures once, and the token ids of every sample as the
    model reads them (see ``vision.build_vision_inputs``).

    The pictures are those of each group's first sample, in group order: the order their pads appear in the packed
    row of ``pack_groups``, so the vision tower, too, runs once per prompt. The other samples of a group have the
    first one's prompt and no vision pad in their responses (``responses_with_vision_pads``): their ids only need
    video pads renamed image pads, as the first one's are."""
    leaders = [group[0] for group in groups]
    leader_rows = [rows[i] for i in leaders] if rows is not None else None
    vision = build_vision_inputs(input_ids[leaders], attention_mask[leaders], leader_rows, processor, response_length)
    renamed = torch.where(input_ids == processor.video_token_id, processor.image_token_id, input_ids)
    renamed[leaders] = vision.input_ids
    return vision, renamed


# ----------------------------------------------------------------------------------------------------------------------
# micro-batches of whole groups
# ----------------------------------------------------------------------------------------------------------------------
def _cut(unit: list[int], size: int) -> list[list[int]]:
    return [unit[i : i + size] for i in range(0, len(unit), size)]


def split_for_pass(
    data: "DataProto", micro_batch_size: int, dynamic: bool, stats: PrefixStats | None
) -> tuple[list["DataProto"], torch.Tensor]:
    """The micro-batches of a forward pass and the permutation their concatenation follows: whole prompt groups
    when prefixes are shared (``stats``, the role's counts), else ``dynamic_batching.split_micro_batches``."""
    if stats is None:
        return split_micro_batches(data, micro_batch_size, dynamic)
    return split_micro_batches_by_group(data, micro_batch_size, dynamic, stats)


def split_micro_batches_by_group(
    data: "DataProto", micro_batch_size: int, dynamic: bool, stats: PrefixStats | None = None
) -> tuple[list["DataProto"], torch.Tensor]:
    """Micro-batches made of whole groups (samples with the same prompt), and the permutation their concatenation
    follows (``dynamic_batching.restore_order`` undoes it).

    The budget is ``micro_batch_size`` samples (fixed) or ``micro_batch_size`` x the padded sequence length in
    tokens, counting each group's prompt once (dynamic). A group over the budget is cut into parts that fit (counted
    in ``stats.split_groups``). Loads are balanced with the LPT rule as in ``dynamic_batching``; every rank of a
    process group runs the same number of micro-batches (each FSDP forward is a collective)."""
    batch = data.batch
    attention_mask = batch["attention_mask"]
    response_length = batch["responses"].shape[-1]
    seq = attention_mask.shape[-1]
    groups, _ = find_groups(
        batch["input_ids"], attention_mask, response_length, data.non_tensor_batch.get(MULTI_MODAL_KEY)
    )
    response_tokens = attention_mask[:, seq - response_length :].sum(-1).tolist()
    prompt_tokens = attention_mask[:, : seq - response_length].sum(-1).tolist()

    def cost(unit: list[int]) -> int:
        return (prompt_tokens[unit[0]] + sum(response_tokens[i] for i in unit)) if dynamic else len(unit)

    budget = micro_batch_size * seq if dynamic else micro_batch_size
    units: list[list[int]] = []
    for group in groups:
        if cost(group) <= budget:
            units.append(group)
            continue
        # the largest parts that fit: as many samples as the budget takes after the prompt
        if dynamic:
            parts, part = [], []
            for i in group:
                if part and cost([*part, i]) > budget:
                    parts.append(part)
                    part = []
                part.append(i)
            parts.append(part)
        else:
            parts = _cut(group, micro_batch_size)
        if stats is not None:
            stats.split_groups += 1
        units.extend(parts)
    costs = [cost(unit) for unit in units]
    if max(costs) > budget:
        raise ValueError(
            f"A sequence of {max(costs)} tokens exceeds the dynamic-batching budget of {budget} tokens per "
            "micro-batch; raise the micro_batch_size_per_device_* setting."
        )
    num_parts = max(1, -(-sum(costs) // budget))
    while (
        num_parts < len(units)
        and max(sum(costs[i] for i in p) for p in balanced_partitions(costs, num_parts)) > budget
    ):
        num_parts += 1
    num_parts = max_over_ranks(num_parts)
    while len(units) < num_parts:  # another rank needs more passes: halve this rank's largest unit
        largest = max(range(len(units)), key=lambda u: (len(units[u]), costs[u]))
        unit = units.pop(largest)
        costs.pop(largest)
        if stats is not None:
            stats.split_groups += 1
        half = (len(unit) + 1) // 2
        for part in (unit[:half], unit[half:]):
            units.append(part)
            costs.append(cost(part))
    parts = balanced_partitions(costs, num_parts)
    micro_groups = [sorted(i for u in part for i in units[u]) for part in parts]
    permutation = torch.tensor([i for group in micro_groups for i in group], dtype=torch.long)
    return [data[group] for group in micro_groups], permutation


# ----------------------------------------------------------------------------------------------------------------------
# the attention function
# ----------------------------------------------------------------------------------------------------------------------
def enable(model: torch.nn.Module) -> None:
    """Route the language model's attention through ``prefix_attention_forward`` (calls without a layout pass
    through to the implementation it had: flash-attn's, else ``attention.varlen_attention_forward``). Ulysses'
    wrapper, when in place, stays: it routes calls with a layout here itself, after its all-to-all."""
    from . import ulysses

    config = ulysses.text_config(model)
    current = config._attn_implementation
    if current in (NAME, FLASH_NAME, ulysses.NAME, ulysses.FLASH_NAME):
        return
    register()
    config._attn_implementation = FLASH_NAME if current == "flash_attention_2" else NAME


@functools.cache
def register() -> None:
    """Register both wrappers with flash-attn's mask function: a packed row never builds a (tokens x tokens) mask."""
    attention.register_wrappers(NAME, FLASH_NAME, prefix_attention_forward)


def prefix_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    *args,
    inner: str | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """transformers' attention-function signature: (1, heads, tokens, dim) -> (1, tokens, heads, dim), None.

    With a ``prefix_layout`` keyword, each segment of the layout attends to its prompt's keys/values and its own
    (see the module docstring); other calls go to the wrapped implementation."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    layout: PrefixLayout | None = kwargs.pop(KWARG, None)
    causal = kwargs.get("is_causal")
    causal = causal if causal is not None else getattr(module, "is_causal", True)
    if layout is None or not causal:
        return attention.inner_function(inner)(
            module, query, key, value, attention_mask, *args, dropout=dropout, scaling=scaling, **kwargs
        )
    if attention_mask is not None or query.shape[0] != 1:
        raise ValueError("Shared-prefix attention runs on one packed row without an attention mask (padding_free).")
    for name in ("cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k", "position_ids", "is_causal"):
        kwargs.pop(name, None)
    if _varlen_fits(query, dropout):
        return _varlen_prefix_attention(query, key, value, layout, scaling), None
    outputs = []
    for segment in layout.segments:
        q = query[:, :, segment.start : segment.end]
        k, v = key[:, :, segment.start : segment.end], value[:, :, segment.start : segment.end]
        prefix = segment.prefix_end - segment.prefix_start
        if prefix == 0:
            out, _ = sdpa_attention_forward(module, q, k, v, None, dropout, scaling, is_causal=True, **kwargs)
        else:
            k = torch.cat([key[:, :, segment.prefix_start : segment.prefix_end], k], dim=2)
            v = torch.cat([value[:, :, segment.prefix_start : segment.prefix_end], v], dim=2)
            if prefix <= segment.end - segment.start:
                # the prompt's queries in front turn sdpa's causal mask (aligned top-left) into the one this segment
                # needs (the whole prompt, then itself causally), with no (response x (prompt + response)) mask,
                # which the CPU kernel keeps as floats for the backward pass; the prompt's rows are computed again
                # and dropped, no more work than the masked blocks while the prompt is not the longer one
                q = torch.cat([query[:, :, segment.prefix_start : segment.prefix_end], q], dim=2)
                out, _ = sdpa_attention_forward(module, q, k, v, None, dropout, scaling, is_causal=True, **kwargs)
                out = out[:, prefix:]
            else:
                mask = layout.mask(segment.end - segment.start, prefix, query.device)
                out, _ = sdpa_attention_forward(module, q, k, v, mask, dropout, scaling, is_causal=False, **kwargs)
        outputs.append(out)  # (1, segment tokens, heads, dim)
    return torch.cat(outputs, dim=1), None


def _varlen_fits(query: torch.Tensor, dropout: float) -> bool:
    """PyTorch's varlen flash kernel serves the call: CUDA, half precision, no dropout."""
    return (
        attention.varlen_available()
        and query.is_cuda
        and query.dtype in (torch.float16, torch.bfloat16)
        and not dropout
    )


def _varlen_prefix_attention(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, layout: PrefixLayout, scaling: float | None
) -> torch.Tensor:
    """All segments in ONE variable-length call: segment i's queries against its gathered keys [prompt ; own]. The
    flash kernel's causal mask aligns the queries with the END of their keys (bottom-right), which is exactly "the
    whole prompt, then causal over the own tokens" (tests/gpu checks it against the per-segment sdpa calls). The
    prompt's keys are copied once per response here (gather; its backward adds the copies' gradients up), a
    (responses x prompt x kv-heads x dim) tensor per layer, small beside the activations the sharing saves."""
    index, cu_q, cu_k, max_q, max_k = layout.varlen_plan(query.device)
    q = query[0].transpose(0, 1)  # (tokens, heads, dim)
    k, v = (t[0].transpose(0, 1).index_select(0, index) for t in (key, value))  # (keys, kv-heads, dim)
    names = attention._varlen_signature()
    options = {"is_causal": True} if "is_causal" in names else {"window_size": (-1, 0)}
    if scaling is not None:
        if "scale" in names:
            options["scale"] = scaling
        else:  # the kernel scales by 1/sqrt(dim): fold the difference into the queries
            q = q * (scaling * q.shape[-1] ** 0.5)
    if k.shape[1] != q.shape[1]:  # grouped-query attention
        if "enable_gqa" in names:
            options["enable_gqa"] = True
        else:
            groups = q.shape[1] // k.shape[1]
            k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    out = attention._varlen_attn()(q, k, v, cu_q, cu_k, max_q, max_k, **options)
    return out.unsqueeze(0)  # (1, tokens, heads, dim)
