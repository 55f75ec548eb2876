"""Streaming the actor's weights into the vLLM engine that shares its process (the hybrid engine).

The actor hands over its full parameters one decoder layer at a time (each bucket is all-gathered from the FSDP
shards by every rank together), so at most one layer is unsharded at once and no second full copy of the model
exists. The buckets go into ONE ``reload_weights`` call as a lazy stream: vLLM's layerwise reload buffers each
layer's tensors until the layer is complete, then loads and re-packs it for its kernels (``model.load_weights``
alone fails on CPU, where linear weights are already re-packed), so a bucket must hold whole modules, which
per-layer buckets do.

Names and layout: the actor hands over its parameters as its Hugging Face module holds them; the engine reads the
released checkpoint's names and layout. Names agree once the wrapper prefixes training adds (torch.compile,
activation checkpointing, FSDP1) are stripped: the vLLM model's own ``load_weights`` applies its
``hf_to_vllm_mapper`` (e.g. Qwen2.5-VL: ``model.language_model.*`` -> ``language_model.model.*``, ``model.visual.*``
-> ``visual.*``, ``lm_head.*`` -> ``language_model.lm_head.*``) and stacks q/k/v and gate/up into its fused
parameters, exactly as when reading a checkpoint from disk. Layouts differ where transformers transposes a tensor on
load (Qwen3-VL-MoE's expert stacks): ``easyrl.models.checkpoint_layout`` undoes that with a transposed view (no copy).
transformers' stacked experts of Qwen2-MoE / Qwen3-MoE go in as they are: vLLM's fused-expert loader reads them.

Mixture-of-experts on CPU: vLLM re-packs the expert stacks for its CPU kernel (and pads the intermediate size to its
alignment) when the model is first loaded, but skips that step when a reload finds the layer's kernel already built:
the reloaded experts would be read in the wrong layout (wrong outputs, or a shape error where padding applies).
Before each reload we drop the kernel of every unquantized expert layer (`rebuild_cpu_expert_kernels`), so that the
reload processes the layer exactly as the first load did.

Tied embeddings: the actor yields the shared matrix once, under the embedding's name; vLLM's tied ``lm_head``
shares that parameter. On CPU vLLM keeps a re-packed copy of the lm_head for its GEMM kernel that reload does not
refresh (the head's layer gets no tensor of its own), so after each reload a tied head takes the GEMM vLLM just
built for the embedding layer from the same tensor (`refresh_cpu_lm_head`).

Expected warnings: after a reload vLLM warns "<Layer>: Failed to load weights" for every layer none of whose tensors
came in the stream, and puts that layer's current tensors back. Three such layers are expected and harmless, so
exactly those messages are dropped (`ExpectedReloadWarnings`); any other layer still warns, since that would be a
weight the actor did not send:
- rotary embeddings (``*RotaryEmbedding``): their cos/sin cache is a buffer computed from the config, in no
  checkpoint;
- the picture normalisation of Qwen3-VL-style models (``FusedMMInputNorm``): its scale and shift are computed from
  the processor's mean and std, in no checkpoint;
- the LM head of a model with tied embeddings (``ParallelLMHead``): its weight is the embedding's tensor, which the
  stream fills (vLLM's ``load_weights`` skips ``lm_head.*`` when embeddings are tied), so the tensor put back holds
  the new values. tests/test_weight_sync_logging.py checks the engine's weights against the actor's after a sync.
"""

import contextlib
import logging
import os
import time
from collections.abc import Iterator

import torch

from ...models.checkpoint_layout import to_released_layout
from .base import WeightBuckets


# prefixes inserted by wrappers around the Hugging Face module; never part of a checkpoint name
_WRAPPER_PREFIXES = ("_orig_mod.", "_checkpoint_wrapped_module.", "_fsdp_wrapped_module.")


def checkpoint_name(name: str) -> str:
    """The Hugging Face checkpoint name of a (possibly wrapped) training parameter."""
    for prefix in _WRAPPER_PREFIXES:
        name = name.replace(prefix, "")
    return name


class SyncStats:
    """Bytes and tensors that went through one weight stream."""

    def __init__(self) -> None:
        self.num_bytes = 0
        self.num_tensors = 0
        self.num_buckets = 0

    def stream(self, buckets: WeightBuckets) -> Iterator[tuple[str, torch.Tensor]]:
        for bucket in buckets:
            self.num_buckets += 1
            for name, tensor in bucket:
                self.num_bytes += tensor.numel() * tensor.element_size()
                self.num_tensors += 1
                yield checkpoint_name(name), tensor


def sync_metrics(seconds: float, num_bytes: float, num_buckets: int) -> dict[str, float]:
    """What one weight sync reports, whatever went over (the full weights, merged LoRA weights or an adapter)."""
    return {
        "rollout/weight_sync_s": seconds,
        "rollout/weight_sync_bytes": float(num_bytes),
        "rollout/weight_sync_gb": num_bytes / 1e9,
        "rollout/weight_sync_gb_per_s": num_bytes / 1e9 / max(seconds, 1e-9),
        "rollout/weight_sync_buckets": float(num_buckets),
    }


def refresh_cpu_lm_head(model: torch.nn.Module) -> None:
    """Give every LM head tied to the embeddings a CPU GEMM of the reloaded matrix (module docstring).

    The reload re-packed every layer the stream filled: an untied head already has its new GEMM, and the embedding
    layer was packed from the very tensor a tied head shares, so the head takes that GEMM rather than packing the
    (vocabulary x hidden) matrix a second time. Only a tied head whose embedding has none is packed here."""
    from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm
    from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead, VocabParallelEmbedding

    embeddings = [
        module
        for module in model.modules()
        if isinstance(module, VocabParallelEmbedding) and not isinstance(module, ParallelLMHead)
    ]
    for head in model.modules():
        if not isinstance(head, ParallelLMHead):
            continue
        embedding = next((module for module in embeddings if module.weight is head.weight), None)
        if embedding is None:
            continue  # untied: re-packed by the reload
        if hasattr(embedding, "cpu_linear"):
            head.cpu_linear = embedding.cpu_linear
        else:
            dispatch_cpu_unquantized_gemm(head, remove_weight=False)


def rebuild_cpu_expert_kernels(model: torch.nn.Module) -> None:
    """Make the next reload re-pack every unquantized expert layer for vLLM's CPU kernel (module docstring)."""
    from vllm.model_executor.layers.fused_moe.routed_experts import RoutedExperts
    from vllm.model_executor.layers.fused_moe.unquantized_fused_moe_method import UnquantizedFusedMoEMethod

    for module in model.modules():
        if isinstance(module, RoutedExperts) and isinstance(module.quant_method, UnquantizedFusedMoEMethod):
            # with no kernel, processing after the load pads, re-packs and builds the kernel, as on the first load
            module.quant_method.moe_kernel = None


# the vLLM logger that reports layers a reload did not fill, and its message
_RELOAD_LOGGER = "vllm.model_executor.model_loader.reload.layerwise"
_NOT_LOADED_MESSAGE = "%s: Failed to load weights"


class ExpectedReloadWarnings(logging.Filter):
    """Drops vLLM's "Failed to load weights" for the layers a reload never fills by design (module docstring)."""

    def __init__(self, tied_embeddings: bool) -> None:
        super().__init__()
        self.tied_embeddings = tied_embeddings

    def filter(self, record: logging.LogRecord) -> bool:
        if record.msg != _NOT_LOADED_MESSAGE or not record.args:
            return True
        layer = str(record.args[0])
        expected = (
            layer.endswith("RotaryEmbedding")
            or layer == "FusedMMInputNorm"
            or (self.tied_embeddings and layer == "ParallelLMHead")
        )
        return not expected


@contextlib.contextmanager
def expected_reload_warnings_dropped(tied_embeddings: bool) -> Iterator[None]:
    reload_logger = logging.getLogger(_RELOAD_LOGGER)
    log_filter = ExpectedReloadWarnings(tied_embeddings)
    reload_logger.addFilter(log_filter)
    try:
        yield
    finally:
        reload_logger.removeFilter(log_filter)


def tied_embeddings(model_config) -> bool:
    """Whether the engine's model ties its LM head to the embeddings. A VL model may say it only at the top of its
    config (Qwen3-VL: ``tie_word_embeddings`` is absent from the text config)."""
    for config in (model_config.hf_text_config, model_config.hf_config):
        tied = getattr(config, "tie_word_embeddings", None)
        if tied is not None:
            return bool(tied)
    return False


def cores_oversubscribed() -> bool:
    """Whether more threads want to run than this process has cores (the last minute's load average)."""
    return os.getloadavg()[0] > len(os.sched_getaffinity(0))


def reload_on_one_thread(multimodal: bool) -> bool:
    """Whether a CPU reload runs on one thread: for a text model on busy cores (below). Not for a vision-language
    model: reloaded on one thread and run on two, the tiny Qwen2.5-VL engine then computed log-probs 0.36-0.43 away
    from the same weights in the actor (a one-worker training run from its second step on, on 2 busy cores; exact
    with the reload on the engine's own threads), so the engine keeps its thread count whatever the load."""
    return not multimodal and cores_oversubscribed()


@contextlib.contextmanager
def torch_threads(count: int) -> Iterator[None]:
    saved = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(saved)


def produced_with_threads(buckets: WeightBuckets, count: int) -> WeightBuckets:
    """The buckets, each produced (all-gathered, LoRA-merged) with ``count`` torch threads whatever the consumer
    runs with: the actor's arithmetic, and so the weights, do not depend on how the engine loads them."""
    iterator = iter(buckets)
    while True:
        with torch_threads(count):
            bucket = next(iterator, None)
        if bucket is None:
            return
        yield bucket


class WeightSyncExtension:
    """Mixed into vLLM's worker class (``LLM(worker_extension_cls=...)``); reached through ``collective_rpc``.

    With ``distributed_executor_backend="external_launcher"`` the worker runs in the caller's process, so the
    bucket iterator (and the collectives inside it) is consumed right here, in step on every rank.
    """

    def easyrl_load_weight_buckets(self, buckets: WeightBuckets) -> dict[str, float]:
        from vllm.platforms import current_platform

        stats = SyncStats()
        start = time.perf_counter()
        model = self.model_runner.get_model()
        load_threads = torch.get_num_threads()
        if current_platform.is_cpu():
            rebuild_cpu_expert_kernels(model)
            if reload_on_one_thread(self.model_config.is_multimodal_model):
                # vLLM's CPU reload is ~900 small memory-bound steps per model (a copy into each layer's fused
                # tensor, a re-pack for the GEMM kernel; for a text model exact with any thread count). Each
                # multi-threaded step ends waiting for all its threads, and on shared cores that is a scheduler time
                # slice each: one thread syncs 3-5x faster there (SmolLM2-135M at load ~13 on 2 cores: 0.7-1.9 s
                # instead of 2.6-7 s)
                buckets = produced_with_threads(buckets, load_threads)
                load_threads = 1
        weights = to_released_layout(self.model_config.hf_config.model_type, stats.stream(buckets))
        with (
            expected_reload_warnings_dropped(tied_embeddings=tied_embeddings(self.model_config)),
            torch_threads(load_threads),
        ):
            self.reload_weights(weights_iterator=weights)  # vLLM worker method: load + re-pack
        if current_platform.is_cpu():
            refresh_cpu_lm_head(model)
        return sync_metrics(time.perf_counter() - start, stats.num_bytes, stats.num_buckets)
