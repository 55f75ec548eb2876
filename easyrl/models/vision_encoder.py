"""The vision tower's pass over one micro-batch: shared over a Ulysses group, and reused while the tower is frozen.

The model still calls its tower once per micro-batch (``self.visual(pixel_values, grid_thw=...)``) and still puts the
features into the pad tokens itself; ``install`` puts a ``TowerEncoder`` in place of the tower's ``forward`` that
decides what the tower actually computes, for the calls ``forward.py`` opens with ``micro_batch``:

- Ulysses (models/ulysses.py): the k ranks of a sequence-parallel group hold the same micro-batch. Instead of each
  of them encoding every picture, each encodes a share of the pictures/videos (whole items, balanced by patch count:
  Qwen2.5-VL's window attention and Qwen2-VL/3-VL's attention work per item, so encoding items apart is exact), and
  an all-gather hands every rank the features of all items. Its backward sums the group's gradients and returns
  each item's to the rank that encoded it (``ulysses.gather_rows``), the same sum the text path uses, so the tower's
  gradients equal those of ``ulysses_size`` 1. Qwen3-VL's deepstack features travel in the same gather.
- Frozen tower (no trainable parameter in it: ``worker.actor.model.freeze_vision_tower``, LoRA without
  ``lora.vision_tower``, the reference): its output depends only on the pixels, so each item's features are kept in
  an LRU of host memory (``worker.actor.model.vision_cache_mb``) under a content key of its pixels and grid, and the
  old-log-prob pass, the reference pass (when it is the same model, LoRA's adapters off) and every update
  micro-batch and epoch of a step reuse them: Long-RL's cached video embeddings.

Collectives stay in step: the tower is FSDP-sharded (each block all-gathers its weights), so every rank must run it
as often as every other. A rank whose share is empty encodes a one-token blank picture (discarded after the
gather, but in the graph, so the backward runs everywhere), and the cache skips the tower only when EVERY rank found
all its items: the hit flag is all-reduced over the world before deciding.
"""

import hashlib
import weakref
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from . import ulysses
from .dynamic_batching import max_over_ranks
from .vision import VisionInputs, vision_tower


# the content key of the blank picture a micro-batch without media encodes (the same on every rank)
BLANK_KEY = b"easyrl-blank-picture"
HITS_METRIC = "perf/vision_cache_hits"
MISSES_METRIC = "perf/vision_cache_misses"
# a critic's frozen tower caches apart from the actor's (its own weights): its counts under their own names
CRITIC_METRIC_NAMES = {HITS_METRIC: "perf/critic_vision_cache_hits", MISSES_METRIC: "perf/critic_vision_cache_misses"}


# ----------------------------------------------------------------------------------------------------------------------
# content keys
# ----------------------------------------------------------------------------------------------------------------------
# id(pixel tensor) -> key, dropped when the tensor dies: the pixels of one picture object are processed once
# (vision._pixels_once) and hashed once for as long as they live
_KEYS: dict[int, bytes] = {}


def content_key(pixels: torch.Tensor, grid: torch.Tensor) -> bytes:
    """A digest of one item's (patches, dim) pixels and its (3,) grid: equal pixels give equal keys, whichever
    call, pass or process the picture arrives in (Ray delivers fresh objects to every call)."""
    memo = _KEYS.get(id(pixels))
    if memo is not None:
        return memo
    digest = hashlib.blake2b(digest_size=20)
    digest.update(str((tuple(grid.tolist()), tuple(pixels.shape), str(pixels.dtype))).encode())
    digest.update(pixels.detach().cpu().contiguous().view(torch.uint8).numpy().data)
    key = digest.digest()
    _KEYS[id(pixels)] = key
    weakref.finalize(pixels, _KEYS.pop, id(pixels), None)
    return key


# ----------------------------------------------------------------------------------------------------------------------
# the cache
# ----------------------------------------------------------------------------------------------------------------------
class EmbeddingCache:
    """Least-recently-used per-item tower outputs in host memory, at most ``budget_bytes`` of them.

    An LRU rather than a cache cleared every step: a frozen tower maps the same pixels to the same features in every
    step, so an entry never goes stale, and the budget alone bounds the memory (entries of older steps leave first).
    One step's items fit in a budget of a few GB for all but the longest videos; beyond it the oldest items of the
    step are encoded again (correct, just slower)."""

    def __init__(self, budget_bytes: int) -> None:
        self.budget_bytes = budget_bytes
        self.entries: OrderedDict[bytes, tuple[torch.Tensor, ...]] = OrderedDict()
        self.bytes = 0
        self.hits = 0
        self.misses = 0

    def __contains__(self, key: bytes) -> bool:
        return key in self.entries

    def get(self, key: bytes, device: torch.device) -> tuple[torch.Tensor, ...]:
        self.entries.move_to_end(key)
        return tuple(t.to(device, non_blocking=True) for t in self.entries[key])

    def put(self, key: bytes, tensors: tuple[torch.Tensor, ...]) -> None:
        size = sum(t.numel() * t.element_size() for t in tensors)
        if size > self.budget_bytes or key in self.entries:
            return
        self.entries[key] = tuple(t.detach().to("cpu", copy=True) for t in tensors)
        self.bytes += size
        while self.bytes > self.budget_bytes:
            _, dropped = self.entries.popitem(last=False)
            self.bytes -= sum(t.numel() * t.element_size() for t in dropped)

    def clear(self) -> None:
        self.entries.clear()
        self.bytes = 0


# ----------------------------------------------------------------------------------------------------------------------
# the tower's replacement forward
# ----------------------------------------------------------------------------------------------------------------------
@dataclass
class MicroBatchCall:
    """What the encoder knows about the micro-batch whose tower call is open."""

    items: list
    """Per item, in pad order: its (patches, dim) pixels and (3,) grid as processed (host memory), for the content
    key; ``BLANK_KEY`` for the blank picture; None where the caller did not say (encoded, never cached)."""
    sp: "ulysses.SequenceParallel | None"


def balance_items(patches: list[int], size: int) -> list[list[int]]:
    """Items (by index) per rank: the largest first, each to the least-loaded rank (ties: the lowest rank), so the
    ranks encode about the same number of patches; each rank's items stay in their original order."""
    loads, shares = [0] * size, [[] for _ in range(size)]
    for item in sorted(range(len(patches)), key=lambda i: (-patches[i], i)):
        rank = min(range(size), key=lambda r: (loads[r], r))
        loads[rank] += patches[item]
        shares[rank].append(item)
    return [sorted(share) for share in shares]


def _unpack(output) -> list[torch.Tensor]:
    """(tokens, hidden) tensors of a tower output: the merged features, then Qwen3-VL's deepstack features."""
    if isinstance(output, torch.Tensor):
        return [output]
    return [output.pooler_output, *(getattr(output, "deepstack_features", None) or [])]


def _repack(output_type: type, tensors: list[torch.Tensor]):
    if issubclass(output_type, torch.Tensor):
        return tensors[0]
    out = output_type(pooler_output=tensors[0])  # the pre-merger hidden states of a shared pass are not kept
    if len(tensors) > 1:
        out.deepstack_features = tensors[1:]
    return out


class TowerEncoder:
    """Stands in for the tower's ``forward``; without an open ``micro_batch`` it is the tower's own forward."""

    def __init__(self, tower: torch.nn.Module) -> None:
        self.forward = tower.forward  # the tower's own (bound) forward
        self.merge = int(getattr(tower, "spatial_merge_size", None) or tower.config.spatial_merge_size)
        self.tower = weakref.ref(tower)
        self.cache: EmbeddingCache | None = None
        self.call: MicroBatchCall | None = None
        # the type of the tower's output and the widths of its tensors: what a fully cached call rebuilds
        self.output_type, self.widths = torch.Tensor, []

    def frozen(self) -> bool:
        return not any(p.requires_grad for p in self.tower().parameters())

    def caching(self) -> bool:
        return self.cache is not None and self.cache.budget_bytes > 0 and self.frozen()

    def __call__(self, hidden_states: torch.Tensor, grid_thw: torch.Tensor, **kwargs):
        call, use_cache = self.call, self.caching()
        if call is None or (call.sp is None and not use_cache):
            return self.forward(hidden_states, grid_thw=grid_thw, **kwargs)
        if len(call.items) != grid_thw.shape[0]:
            raise RuntimeError(f"The tower got {grid_thw.shape[0]} items but the micro-batch has {len(call.items)}.")
        patches = [int(g.prod()) for g in grid_thw]
        tokens = [count // self.merge**2 for count in patches]
        keys = [_key(item) for item in call.items] if use_cache else [None] * len(patches)
        # items to encode: those not cached, an item repeated in the micro-batch (the n samples of a prompt) once
        first: dict[bytes, int] = {}
        todo = []
        for i, key in enumerate(keys):
            if key is None or (key not in self.cache and key not in first):
                todo.append(i)
            if key is not None:
                first.setdefault(key, i)
        if use_cache:
            self.cache.hits += len(patches) - len(todo)
            self.cache.misses += len(todo)
        encoded: dict[int, torch.Tensor] = {}
        if not use_cache or _anyone(bool(todo)):
            encoded = self._encode(hidden_states, grid_thw, patches, tokens, todo, call.sp, kwargs)
        for i in todo:
            if keys[i] is not None:
                self.cache.put(keys[i], tuple(encoded[i].split(self.widths, dim=-1)))
        rows = []
        for i, key in enumerate(keys):
            if i in encoded:
                rows.append(encoded[i])
            elif key is not None and first[key] in encoded:
                rows.append(encoded[first[key]])
            else:
                rows.append(torch.cat(self.cache.get(key, hidden_states.device), dim=-1))
        return _repack(self.output_type, list(torch.cat(rows).split(self.widths, dim=-1)))

    def _encode(self, hidden_states, grid_thw, patches, tokens, todo, sp, kwargs):
        """Encode the items ``todo`` (this rank: its share of them; a blank picture for an empty share) and
        gather them: {item: (tokens, sum of widths)}, the output's tensors side by side."""
        size, rank = (sp.size, sp.rank) if sp is not None else (1, 0)
        shares = balance_items([patches[i] for i in todo], size)
        shares = [[todo[j] for j in share] for share in shares]
        starts = [0, *torch.tensor(patches).cumsum(0).tolist()]
        mine = shares[rank]
        if mine:
            pixels = torch.cat([hidden_states[starts[i] : starts[i + 1]] for i in mine])
            grid = grid_thw[mine]
        else:  # one token after the merge, its output dropped below
            pixels = hidden_states.new_zeros(self.merge**2, hidden_states.shape[-1])
            grid = torch.tensor([[1, self.merge, self.merge]], dtype=grid_thw.dtype, device=grid_thw.device)
        output = self.forward(pixels, grid_thw=grid, **kwargs)
        tensors = _unpack(output)
        self.output_type, self.widths = type(output), [t.shape[-1] for t in tensors]
        local = torch.cat(tensors, dim=-1)  # (tokens of this rank's items, sum of widths)
        counts = [sum(tokens[i] for i in share) if share else 1 for share in shares]
        gathered = ulysses.gather_rows(local, counts, sp) if sp is not None else local
        encoded, offset = {}, 0
        for share, count in zip(shares, counts):
            for i in share:
                encoded[i] = gathered[offset : offset + tokens[i]]
                offset += tokens[i]
            offset += 0 if share else count
        return encoded


def _key(item) -> bytes | None:
    if item is None or isinstance(item, bytes):
        return item
    return content_key(*item)


def _anyone(flag: bool) -> bool:
    """True on every rank when ``flag`` is true on any rank (the tower runs everywhere or nowhere)."""
    return bool(max_over_ranks(int(flag)))


# ----------------------------------------------------------------------------------------------------------------------
# entry points
# ----------------------------------------------------------------------------------------------------------------------
def install(model: torch.nn.Module, cache_bytes: int | None = None) -> TowerEncoder | None:
    """Put a ``TowerEncoder`` in place of ``model``'s tower forward (once; None for a text model).
    ``cache_bytes``: the frozen tower's cache budget (``worker.actor.model.vision_cache_mb``; 0: no cache)."""
    tower = vision_tower(model)
    if tower is None:
        return None
    encoder = tower.__dict__.get("forward")
    if not isinstance(encoder, TowerEncoder):
        encoder = TowerEncoder(tower)
        tower.forward = encoder
    if cache_bytes is not None:
        encoder.cache = EmbeddingCache(cache_bytes) if cache_bytes > 0 else None
    return encoder


def encoder_of(model: torch.nn.Module) -> TowerEncoder | None:
    tower = vision_tower(model)
    encoder = tower.__dict__.get("forward") if tower is not None else None
    return encoder if isinstance(encoder, TowerEncoder) else None


@contextmanager
def micro_batch(
    model: torch.nn.Module, vision: VisionInputs | None, sp: "ulysses.SequenceParallel | None"
) -> Iterator[None]:
    """Open the tower call of one micro-batch (its items, the Ulysses group); a no-op for text inputs and for a
    model whose tower would run as it is (no group, no cache)."""
    encoder = encoder_of(model) if vision is not None else None
    if vision is not None and encoder is None and sp is not None:
        encoder = install(model)
    if encoder is None:
        yield
        return
    if vision.blank_tokens:
        items = [BLANK_KEY]
    else:  # a caller that lists no items (e.g. pictures regrouped by prompt) gets them encoded, not cached
        items = vision.items or [None] * int(vision.image_grid_thw.shape[0])
    encoder.call = MicroBatchCall(items, sp)
    try:
        yield
    finally:
        encoder.call = None


def take_cache_metrics(*models: torch.nn.Module | None) -> dict[str, float]:
    """Items served from / encoded into the frozen towers' caches since the last call (``perf/vision_cache_hits``,
    ``perf/vision_cache_misses``, summed over ``models``); empty when no model caches."""
    encoders = [encoder_of(m) for m in models if m is not None]
    caches = [e.cache for e in encoders if e is not None and e.caching()]
    if not caches:
        return {}
    metrics = {HITS_METRIC: float(sum(c.hits for c in caches)), MISSES_METRIC: float(sum(c.misses for c in caches))}
    for cache in caches:
        cache.hits = cache.misses = 0
    return metrics
