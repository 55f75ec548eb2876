"""vLLM rollout in SPMD mode: one engine per worker rank, inside the worker's torch.distributed group.

``distributed_executor_backend="external_launcher"`` makes vLLM join the process group that already exists instead
of starting its own processes. vLLM lays its tensor-parallel groups over consecutive ranks: with
``tensor_parallel_size`` = t, ranks [0, t) form engine 0, [t, 2t) engine 1, ... Each engine is one data-parallel
rollout rank: every rank of a group must receive the same prompts (the worker's dispatch sends chunk
``rank // t``) and sample with the same seed, while different groups use different seeds.

Sampling draws from per-request generators seeded from ``rollout.seed + dp_rank`` (one fresh seed per prompt and
call), never from the process-global torch RNG: the actor shares this process, and anything it draws at random
(differently on each rank) would otherwise shift the engine's samples and break the lockstep of a tensor-parallel
group. It also makes rollouts reproducible for a given seed.
"""

import contextlib
import logging
import os
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch

from ...config import RolloutConfig
from ...config.schema import DEFAULT_CPU_KV_CACHE_BYTES
from ...utils import device
from .base import (
    BaseRollout,
    GenerationRequest,
    GenerationTimer,
    SamplingSettings,
    WeightBuckets,
    finish_rollout,
    prompt_token_lists,
    resolve_sampling,
)
from .lora_sync import (
    ADAPTER_ID,
    ADAPTER_NAME,
    IN_MEMORY_PATH,
    LORA_SYNC_KEY,
    ActorLora,
    adapter_refusal_before_start,
    check_lora_sync_mode,
    engine_max_lora_rank,
)
from .weight_sync import sync_metrics


logger = logging.getLogger(__name__)

VLLM_DTYPES = {
    "bf16": "bfloat16",
    "bfloat16": "bfloat16",
    "fp16": "float16",
    "float16": "float16",
    "fp32": "float32",
    "float32": "float32",
}
# vLLM needs an explicit KV-cache size on CPU (gpu_memory_utilization would be read as a share of host RAM)
# KV block size on CPU. vLLM's CPU default (128) is longer than most RL prompts, and prefix caching shares only full
# blocks, so the n samples of a prompt each prefilled it again; with 32 (the smallest its CPU attention takes) they
# share the prompt's whole blocks within one generate call: 8 prompts x n=4 of 57 tokens prefill in 2.0 s, not 3.6 s.
CPU_KV_BLOCK_SIZE = 32
# DataProto multi_modal_data keys -> vLLM multi_modal_data keys
MULTI_MODAL_KEYS = {"images": "image", "videos": "video"}
WEIGHT_SYNC_EXTENSION = "easyrl.workers.rollout.lora_sync.LoraSyncExtension"


# vLLM adds the sample index to a request's seed (n samples use seed .. seed + n - 1): stay clear of int32's end
MAX_REQUEST_SEED = 2**31 - 2**16


def call_request_seeds(seed: Any, dp_rank: int, num_prompts: int) -> list[int]:
    """The per-prompt seeds of a generate call that names its seed (``GenerationRequest.seed``: an int or a list of
    ints) on data-parallel rollout rank ``dp_rank``. A bare engine given these seeds samples the same tokens."""
    rng = np.random.default_rng([*np.atleast_1d(seed), dp_rank])
    return rng.integers(0, MAX_REQUEST_SEED, size=num_prompts).tolist()


def rollout_parallel_layout(rank: int, world_size: int, tensor_parallel_size: int) -> tuple[int, int, int]:
    """(dp_rank, dp_size, tp_rank) of ``rank`` when vLLM carves tensor-parallel groups out of the world."""
    if tensor_parallel_size < 1 or world_size % tensor_parallel_size != 0:
        raise ValueError(
            f"`worker.rollout.tensor_parallel_size` ({tensor_parallel_size}) must divide the number of workers "
            f"({world_size}, i.e. trainer.nnodes x trainer.n_gpus_per_node)."
        )
    return rank // tensor_parallel_size, world_size // tensor_parallel_size, rank % tensor_parallel_size


SHM_FOLDER = "/dev/shm"


def _remove_stale_segment(group_name: str, rank: int) -> None:
    """Remove this rank's segment of ``group_name`` left by a killed job that had the same MASTER_PORT (ports are
    reused; a SIGKILLed job never unlinks its segments): the port is this live job's now, and the rank creates its
    own segment right after, so one already there is stale and would fail the creation with errno 17."""
    path = os.path.join(SHM_FOLDER, f"{group_name}_{rank}")
    try:
        os.remove(path)
    except FileNotFoundError:
        return
    except OSError as error:  # another user's segment: vLLM's own error will name it
        logger.warning("Cannot remove the stale shared-memory segment %s: %s", path, error)
        return
    logger.info("Removed the stale shared-memory segment %s (a killed run's)", path)


def _job_unique_cpu_shm_names() -> None:
    """Name the shared-memory segments of vLLM's CPU tensor-parallel communicator after this job's MASTER_PORT.

    With external_launcher vLLM derives the name from the ``env://`` init method alone, so two jobs on one machine
    (or a new job after a killed one, whose segments stay in /dev/shm) collide with "create shm ... errno: 17".
    """
    from vllm.distributed.device_communicators import cpu_communicator

    shm_cls = getattr(cpu_communicator, "_CPUSHMDistributed", None)
    original = getattr(shm_cls, "make_group_name", None)
    if original is None or getattr(original, "easyrl_job_unique", False):
        return

    def make_group_name(communicator: Any) -> str:
        # every rank of the job has the same MASTER_PORT, and no other live job on this machine does
        os.environ["VLLM_DIST_IDENT"] = f"easyrl{os.environ.get('MASTER_PORT', '')}"
        name = original(communicator)
        _remove_stale_segment(name, communicator.rank)
        return name

    make_group_name.easyrl_job_unique = True
    shm_cls.make_group_name = staticmethod(make_group_name)


@contextlib.contextmanager
def _cpu_engine_environment() -> Iterator[None]:
    """Process state around building a CPU engine, restored afterwards for the actor that shares the process.

    - AMX permission before vLLM's bf16 CPU kernels first run (else SIGILL on tiny batches).
    - TORCHDYNAMO_DISABLE while vLLM's modules are imported: it decorates its log-prob gather with torch.compile,
      which costs a 4-20 s compile on the first generate and gives the same numbers uncompiled.
    - vLLM's CPU worker drops torch to one thread and replaces ``torch.set_num_threads`` with a no-op.
    """
    if device.is_cuda_available():
        yield
        return
    device.prepare_cpu_kernels()
    saved_env = os.environ.get("TORCHDYNAMO_DISABLE")
    saved_threads, saved_set_num_threads = torch.get_num_threads(), torch.set_num_threads
    os.environ["TORCHDYNAMO_DISABLE"] = "1"
    try:
        _job_unique_cpu_shm_names()
        yield
    finally:
        if saved_env is None:
            os.environ.pop("TORCHDYNAMO_DISABLE", None)
        else:
            os.environ["TORCHDYNAMO_DISABLE"] = saved_env
        torch.set_num_threads = saved_set_num_threads
        torch.set_num_threads(saved_threads)


def _engine_kwargs(
    config: RolloutConfig,
    tensor_parallel_size: int,
    seed: int,
    max_lora_rank: int | None = None,
    hf_overrides: dict | None = None,
) -> dict[str, Any]:
    """The vLLM engine's arguments. ``hf_overrides``: the actor's ``model.override_config``, so that the engine runs
    the model the actor trains (a longer ``max_position_embeddings``, a ``rope_scaling``), not the folder's own."""
    # the config check (easyrl/config/validate.py) has refused every value this could not run with; a RolloutConfig
    # built in code rather than loaded has no derived max_model_len yet
    max_model_len = config.max_model_len or config.prompt_length + config.response_length
    kwargs: dict[str, Any] = {
        "distributed_executor_backend": "external_launcher",
        "tensor_parallel_size": tensor_parallel_size,
        "dtype": VLLM_DTYPES[config.dtype],
        "seed": seed,
        "max_model_len": max_model_len,
        "max_num_batched_tokens": config.max_num_batched_tokens,
        "enable_chunked_prefill": config.enable_chunked_prefill,
        "enforce_eager": config.enforce_eager,
        "gpu_memory_utilization": config.gpu_memory_utilization,
        "disable_log_stats": config.disable_log_stats,
        "trust_remote_code": config.trust_remote_code,
        "worker_extension_cls": WEIGHT_SYNC_EXTENSION,
        # log-probs after temperature scaling: the actor computes log_softmax(logits / temperature) too
        "logprobs_mode": "processed_logprobs",
        "enable_sleep_mode": device.supports_sleep_mode(),
    }
    if hf_overrides:
        kwargs["hf_overrides"] = dict(hf_overrides)
    if max_lora_rank is not None:  # one adapter: the actor's (easyrl/workers/rollout/lora_sync.py)
        kwargs.update(enable_lora=True, max_lora_rank=max_lora_rank, max_loras=1)
    if config.limit_images > 0:
        kwargs["limit_mm_per_prompt"] = {"image": config.limit_images}
    kwargs.update(kv_cache_kwargs(config.kv_cache_memory_bytes))
    return kwargs


def kv_cache_kwargs(kv_cache_memory_bytes: int | None) -> dict[str, Any]:
    """The KV-cache arguments of a vLLM engine (the rollout's and a judge's): the configured size, and on CPU a
    default size and CPU_KV_BLOCK_SIZE-token blocks."""
    kwargs: dict[str, Any] = {}
    if kv_cache_memory_bytes is not None:
        kwargs["kv_cache_memory_bytes"] = kv_cache_memory_bytes
    if not device.is_cuda_available():
        kwargs.setdefault("kv_cache_memory_bytes", DEFAULT_CPU_KV_CACHE_BYTES)
        kwargs["block_size"] = CPU_KV_BLOCK_SIZE
    return kwargs


# a row's video sampling rate when it does not say (qwen-vl-utils' default, and data.video_fps')
DEFAULT_VIDEO_FPS = 2.0


def _video_with_metadata(frames: Any, fps: float) -> tuple[Any, dict[str, Any]]:
    """(frames, metadata): the frames were sampled already, so vLLM must take every one of them (as the dataset's
    processor did); Qwen2.5-VL / Qwen3-VL also read the rate for their temporal positions and timestamps."""
    count = len(frames)
    metadata = {
        "fps": fps,
        "total_num_frames": count,
        "frames_indices": list(range(count)),
        "duration": count / fps,
        "do_sample_frames": False,
    }
    return frames, metadata


def _vllm_multi_modal_data(row: Any) -> dict[str, Any] | None:
    if not row:
        return None
    data = {
        MULTI_MODAL_KEYS[key]: value
        for key, value in row.items()
        if key in MULTI_MODAL_KEYS and value is not None and len(value)
    }
    if "video" in data:
        rates = row.get("video_fps") or [DEFAULT_VIDEO_FPS] * len(data["video"])
        data["video"] = [_video_with_metadata(frames, fps) for frames, fps in zip(data["video"], rates)]
    return data or None


def check_cpu_head_size(head_size: int, model_path: str, what: str, way_out: str) -> None:
    """Refuse, naming the model, its head size and the way out, a model whose attention heads vLLM's CPU backend has
    no kernel for: its engine starts, and the first generation failed with "Unsupported CPU attention configuration"
    deep in a Ray traceback."""
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

    supported = CPUAttentionBackend.get_supported_head_sizes()
    if head_size not in supported:
        raise ValueError(
            f"The {what} (vLLM on CPU) cannot run {model_path}: its attention heads have {head_size} dimensions, "
            f"and vLLM's CPU attention has kernels for {supported} only. {way_out}, or use a model whose head size "
            "is one of those (a GPU runs it)."
        )


class VLLMRollout(BaseRollout):
    def __init__(
        self,
        model_path: str,
        config: RolloutConfig,
        tokenizer: Any,
        *,
        rank: int,
        world_size: int,
        tokenizer_path: str | None = None,
        load_format: str = "auto",
        lora: ActorLora | None = None,
        hf_overrides: dict | None = None,
    ) -> None:
        """Start this rank's engine from the checkpoint folder.

        ``load_format="dummy"`` (random weights, no disk read) is only safe for tests that sync every weight in: it
        also randomises persistent buffers that no checkpoint holds (e.g. Qwen2.5-VL's fused image normalisation),
        which a weight sync never repairs.

        ``lora``: the actor's adapters. ``lora_route`` then says how the actor reaches the engine: "adapter" (the
        engine serves the base weights from ``model_path`` and takes the adapter after each update,
        ``update_adapter``) or "merged" (merged weights through ``update_weights``); see lora_sync.py.
        ``hf_overrides``: the actor's ``model.override_config``, applied to the engine's model config too.
        """
        self.config = config
        self.tokenizer = tokenizer
        self.pad_token_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self.dp_rank, self.dp_size, self.tp_rank = rollout_parallel_layout(
            rank, world_size, config.tensor_parallel_size
        )
        self._request_seeds = np.random.default_rng(config.seed + self.dp_rank)
        self._sleeping_tags: set[str] = set()
        self._last_sync_metrics: dict[str, float] = {}
        self.lora = lora
        self.lora_route: str | None = None
        self._lora_request: Any = None  # set once an adapter is in the engine
        with _cpu_engine_environment():
            from vllm import LLM

            max_lora_rank = self._lora_rank_before_start(model_path, config)
            self.llm = LLM(
                model=model_path,
                tokenizer=tokenizer_path or model_path,
                load_format=load_format,
                # same seed inside a tensor-parallel group (identical sampling), different across groups
                **_engine_kwargs(
                    config, config.tensor_parallel_size, config.seed + self.dp_rank, max_lora_rank, hf_overrides
                ),
            )
        if self.lora_route == "adapter":
            (unserved,) = self.llm.collective_rpc("easyrl_unserved_lora_modules", args=(list(lora.module_names),))
            if unserved:
                shown = ", ".join(unserved[:5]) + (f" and {len(unserved) - 5} more" if len(unserved) > 5 else "")
                vision = any(".visual." in name or "vision" in name for name in unserved)
                self._lora_falls_back(
                    f"vLLM's LoRA does not serve the adapters of {shown}",
                    "worker.actor.model.lora.vision_tower=false (adapters on the language model only)"
                    if vision
                    else None,
                )
        self.is_multimodal = self.llm.llm_engine.model_config.is_multimodal_model
        if not device.is_cuda_available():
            way_out = (
                "Run it on a GPU (worker.rollout.name=hf generates from text prompts only)"
                if self.is_multimodal
                else "Set worker.rollout.name=hf (generation by the actor's own model, slower)"
            )
            check_cpu_head_size(
                self.llm.llm_engine.model_config.get_head_size(), model_path, "rollout engine", way_out
            )
        self.stop_token_ids = self._eos_token_ids()
        self.sleep()

    def _lora_rank_before_start(self, model_path: str, config: RolloutConfig) -> int | None:
        """Pick the LoRA route from what is known before the engine starts; the ``max_lora_rank`` to start the engine
        with (None: an engine without LoRA)."""
        if self.lora is None:
            return None
        check_lora_sync_mode(config.lora_sync)
        if config.lora_sync == "merged":
            self.lora_route = "merged"
            logger.info("`%s=merged`: the engine gets merged weights after each update.", LORA_SYNC_KEY)
            return None
        from transformers import AutoConfig

        hf_config = AutoConfig.from_pretrained(model_path, trust_remote_code=config.trust_remote_code)
        reason = adapter_refusal_before_start(self.lora, hf_config)
        if reason is not None:
            self._lora_falls_back(reason)
            return None
        self.lora_route = "adapter"
        return engine_max_lora_rank(self.lora.rank)

    def _lora_falls_back(self, reason: str, adapter_setting: str | None = None) -> None:
        """``adapter_setting``: a setting with which the engine would take the adapter, named to the user."""
        keep = f" Set {adapter_setting} for the adapter route." if adapter_setting else ""
        if self.config.lora_sync == "adapter":
            raise ValueError(
                f"`{LORA_SYNC_KEY}=adapter`, but {reason}. Set {LORA_SYNC_KEY}=auto (or merged) to stream merged "
                f"weights into the engine instead.{keep}"
            )
        logger.warning(
            "LoRA: the rollout engine gets MERGED weights after each update (a full-model sync), not the adapter: "
            "%s.%s Set %s=merged to choose this route without this warning.",
            reason,
            keep,
            LORA_SYNC_KEY,
        )
        self.lora_route = "merged"

    def _eos_token_ids(self) -> list[int]:
        """The tokenizer's eos plus any extra eos of the model's generation config (e.g. Qwen's <|endoftext|>)."""
        ids = {self.tokenizer.eos_token_id} if self.tokenizer.eos_token_id is not None else set()
        generation_config = self.llm.llm_engine.model_config.try_get_generation_config() or {}
        extra = generation_config.get("eos_token_id")
        ids.update(extra if isinstance(extra, list) else [extra] if extra is not None else [])
        return sorted(ids)

    # ------------------------------------------------------------------------------------------------------------------
    # memory between phases (GPU only: vLLM rejects sleep mode on CPU)
    # ------------------------------------------------------------------------------------------------------------------
    def sleep(self) -> None:
        """Offload the weights and drop the KV cache (level 1) so training gets the device memory."""
        if device.supports_sleep_mode() and not self._sleeping_tags:
            self.llm.sleep(level=1)
            self._sleeping_tags = {"weights", "kv_cache"}

    def wake_up(self) -> None:
        """Bring the weights back only: the KV cache is allocated after the sync, when generation needs it."""
        self._wake({"weights"})

    def _wake(self, tags: set[str]) -> None:
        tags = tags & self._sleeping_tags
        if tags:
            self.llm.wake_up(tags=sorted(tags))
            self._sleeping_tags -= tags

    # ------------------------------------------------------------------------------------------------------------------
    # weights
    # ------------------------------------------------------------------------------------------------------------------
    def update_weights(self, buckets: WeightBuckets) -> None:
        self._wake({"weights"})
        (self._last_sync_metrics,) = self.llm.collective_rpc("easyrl_load_weight_buckets", args=(buckets,))
        # cached KV blocks and vision-encoder outputs were computed with the old weights
        self.llm.reset_prefix_cache()
        if self.is_multimodal:
            self.llm.llm_engine.reset_encoder_cache()
            # processed pixels are still valid, but an RL step rarely shows a picture again: without this, every
            # engine keeps up to mm_processor_cache_gb (4 GiB by default) of old pictures in host memory
            self.llm.llm_engine.reset_mm_cache()
        device.empty_cache()

    def update_adapter(self, gather: Callable[[], dict[str, torch.Tensor]]) -> None:
        """Replace the engine's adapter by the actor's current one (the "adapter" route). ``gather()`` returns the full
        adapter tensors under peft's names (a collective: every rank calls this together); the base weights stay as
        the engine loaded them."""
        from vllm.lora.request import LoRARequest

        if self.lora_route != "adapter":
            raise RuntimeError(f"This engine's LoRA route is {self.lora_route!r}: it takes no adapter.")
        self._wake({"weights"})
        start = time.perf_counter()
        tensors = gather()
        (num_bytes,) = self.llm.collective_rpc("easyrl_load_lora", args=(self.lora.peft_config, tensors))
        self._last_sync_metrics = sync_metrics(time.perf_counter() - start, num_bytes, num_buckets=1)
        self._lora_request = LoRARequest(ADAPTER_NAME, ADAPTER_ID, IN_MEMORY_PATH)
        self.llm.reset_prefix_cache()  # cached KV blocks were computed with the old adapter
        if self.is_multimodal:
            self.llm.llm_engine.reset_encoder_cache()
            self.llm.llm_engine.reset_mm_cache()
        device.empty_cache()

    # ------------------------------------------------------------------------------------------------------------------
    # generation
    # ------------------------------------------------------------------------------------------------------------------
    def _sampling_params(self, settings: SamplingSettings, num_prompts: int, seed: Any = None) -> list:
        """One SamplingParams per prompt, each with its own seed (its n samples use seed, seed + 1, ...).

        ``seed`` (``GenerationRequest.seed``: an int or a list of ints, e.g. the trainer's (rollout.seed, step, round))
        replaces the running generator for this call, so that a run resumed from a checkpoint draws the same samples
        as the uninterrupted run whatever was generated before."""
        from vllm import SamplingParams

        if seed is None:
            seeds = self._request_seeds.integers(0, MAX_REQUEST_SEED, size=num_prompts).tolist()
        else:
            seeds = call_request_seeds(seed, self.dp_rank, num_prompts)
        common = {
            "n": settings.engine_n,
            "temperature": settings.temperature,
            "top_p": settings.top_p,
            "top_k": settings.top_k if settings.top_k > 0 else 0,
            "max_tokens": settings.max_tokens,
            "ignore_eos": settings.ignore_eos,
            "stop_token_ids": self.stop_token_ids,
            "logprobs": 0,  # the sampled token's log-prob only
            "detokenize": False,
            **dict(settings.engine),  # validation's repetition_penalty, min_p, ... (VAL_ENGINE_KEYS)
        }
        return [SamplingParams(seed=seed, **common) for seed in seeds]

    def _engine_inputs(self, prompts: Any) -> list[dict[str, Any]]:
        token_lists = prompt_token_lists(prompts, self.pad_token_id)
        multi_modal = prompts.non_tensor_batch.get("multi_modal_data")
        inputs = []
        for i, token_ids in enumerate(token_lists):
            item: dict[str, Any] = {"prompt_token_ids": token_ids}
            mm_data = _vllm_multi_modal_data(multi_modal[i]) if multi_modal is not None else None
            if mm_data is not None:
                item["multi_modal_data"] = mm_data
            inputs.append(item)
        return inputs

    def generate_sequences(self, prompts: Any, request: GenerationRequest | None = None) -> Any:
        request = request or GenerationRequest()
        settings = resolve_sampling(self.config, request)
        self._wake({"weights", "kv_cache"})
        with GenerationTimer() as timer:
            inputs = self._engine_inputs(prompts)
            sampling_params = self._sampling_params(settings, len(inputs), request.seed)
            outputs = self.llm.generate(
                inputs, sampling_params, use_tqdm=not self.config.disable_tqdm, lora_request=self._lora_request
            )
        response_ids, response_log_probs = [], []
        for output in outputs:
            for completion in sorted(output.outputs, key=lambda c: c.index):
                token_ids = list(completion.token_ids)
                response_ids.append(token_ids)
                response_log_probs.append(
                    [step[token].logprob for step, token in zip(completion.logprobs or [], token_ids)]
                )
        data = finish_rollout(prompts, response_ids, response_log_probs, settings, self.pad_token_id, timer.seconds)
        data.meta_info["metrics"].update(self._last_sync_metrics)  # reported once, with the first generation after it
        self._last_sync_metrics = {}
        return data
