"""The FSDP2 worker: one process per device hosting the actor, rollout, reference and/or critic roles.

Roles named together (``actor_rollout_ref``) live in one process and share its device: the hybrid engine. The
driver reaches the worker through a ``RayWorkerGroup``; every public method below is tagged with its dispatch mode.
The ``rm`` part is a frozen sequence-classification reward model (``worker.reward.judge.kind=classifier``), built
like the reference: its own FSDP2 module on the same devices, no optimizer (see ``reward_model.py``).

Batch sizes (EasyR1 semantics): ``global_batch_size`` counts PROMPTS per optimizer step over all devices; each
prompt has ``rollout.n`` responses, so one device's mini-batch holds ``global_batch_size * rollout.n / world``
samples. ``micro_batch_size_per_device_*`` counts samples per forward pass on one device (with dynamic batching:
the token budget is that many padded sequences). The lr scheduler advances once per ``update_*`` call.

The rollout engine is plugged in by ``easyrl.workers.rollout.build_rollout(worker) -> RolloutEngine`` (built in
``init_model`` when the role includes "rollout"); see ``RolloutEngine`` for what it must provide.
"""

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Protocol

import torch
import torch.distributed as dist

from ..config import WorkerConfig
from ..config.schema import ModelConfig
from ..controller.dispatch import Dispatch, register
from ..controller.worker import Worker
from ..models import lora, vision_encoder
from ..models.ulysses import SequenceParallel, build_sequence_parallel, dispatch_layout
from ..utils import device
from ..utils.logging import setup_worker_logging
from . import fsdp_utils
from .actor import Actor
from .critic import Critic
from .fsdp_checkpoint import load_role_checkpoint, save_config_folder, save_role_checkpoint
from .optim import build_lr_scheduler, build_optimizer
from .reward_model import RewardModel
from .rollout.lora_sync import sync_actor_weights


ROLES: dict[str, frozenset[str]] = {
    "actor": frozenset({"actor"}),
    "ref": frozenset({"ref"}),
    "critic": frozenset({"critic"}),
    "actor_ref": frozenset({"actor", "ref"}),
    "actor_rollout": frozenset({"actor", "rollout"}),
    "actor_rollout_ref": frozenset({"actor", "rollout", "ref"}),
    "actor_rollout_rm": frozenset({"actor", "rollout", "rm"}),
    "actor_rollout_ref_rm": frozenset({"actor", "rollout", "ref", "rm"}),
    "rm": frozenset({"rm"}),
    # generation alone (`easyrl generate` / `easyrl eval`): the vLLM engine loads the weights from the model path
    "rollout": frozenset({"rollout"}),
    "rollout_rm": frozenset({"rollout", "rm"}),
}
ROLLOUT_MESH = "rollout"
# the data-parallel layout of the training roles: the ranks of one Ulysses group share a chunk (models/ulysses.py)
TRAIN_MESH = "train"


class RolloutEngine(Protocol):
    """What a rollout engine hosted in the worker provides (``sleep`` / ``wake_up`` are optional)."""

    def generate_sequences(self, prompts: "Any", request: "Any" = None) -> "Any":
        """DataProto of prompts -> DataProto of responses (this rank's share)."""

    def update_weights(self, buckets: Iterator[list[tuple[str, torch.Tensor]]]) -> None:
        """Load new policy weights, one bucket (decoder layer) at a time; called on every rank together."""


def _reduce_metrics_over_ranks(metrics: dict[str, float]) -> dict[str, float]:
    """Mean of each metric over all ranks (every rank reports the same keys, in any order)."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return metrics
    keys = sorted(metrics)
    values = torch.tensor([metrics[k] for k in keys], dtype=torch.float64, device=device.get_torch_device())
    dist.all_reduce(values)
    values /= dist.get_world_size()
    return dict(zip(keys, values.tolist()))


class FSDPWorker(Worker):
    def __init__(self, config: WorkerConfig, role: str, run_dir: str | None = None) -> None:
        """``run_dir``: the run's folder; its ``logs/<role>_<rank>.log`` gets everything the engine and libraries
        print (None: the process's output stays as it is, e.g. in tests)."""
        super().__init__()
        if run_dir is not None:  # before vLLM is first imported in this process
            setup_worker_logging(run_dir, self.rank, group=role)
        if role not in ROLES:
            raise ValueError(f"Unknown worker role `{role}`; choose one of: {', '.join(ROLES)}.")
        self.config = config
        self.role = role
        self.parts = ROLES[role]
        self.device_mesh = None
        self.sp: SequenceParallel | None = None
        self.tokenizer = None
        self.processor = None
        self.actor_module: torch.nn.Module | None = None
        self.ref_module: torch.nn.Module | None = None
        self.critic_module: torch.nn.Module | None = None
        self.rm_module: torch.nn.Module | None = None
        self.reward_model: RewardModel | None = None
        self.actor: Actor | None = None
        self.ref: Actor | None = None
        self.critic: Critic | None = None
        self.rollout: RolloutEngine | None = None
        self.optimizers: dict[str, torch.optim.Optimizer] = {}
        self.lr_schedulers: dict[str, torch.optim.lr_scheduler.LRScheduler] = {}
        # the dtype of each trainable role's model path: the Hugging Face folders written from it use it
        self.released_dtypes: dict[str, torch.dtype | None] = {}

    # ------------------------------------------------------------------------------------------------------------------
    # building (the config was validated and its derived values filled before Ray started: nothing is checked here)
    # ------------------------------------------------------------------------------------------------------------------
    def _build_trainable(self, role: str, role_config: Any, kind: str) -> torch.nn.Module:
        module = fsdp_utils.build_fsdp_model(
            role_config.model,
            role_config.fsdp,
            self.device_mesh,
            kind=kind,
            trainable=True,
            default_dtype=torch.float32,
        )
        self.released_dtypes[role] = fsdp_utils.model_path_dtype(role_config.model, kind)
        lora_lr = role_config.model.lora.lr if role_config.model.lora.rank > 0 else None
        optimizer = build_optimizer(module, role_config.optim, f"worker.{role}.optim", lr=lora_lr)
        self.optimizers[role] = optimizer
        self.lr_schedulers[role] = build_lr_scheduler(optimizer, role_config.optim, f"worker.{role}.optim")
        return module

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self) -> None:
        """Load every model of this worker's roles and build the rollout engine (re-callable: reloads from the
        model paths)."""
        actor_config, critic_config = self.config.actor, self.config.critic
        main_config = critic_config if self.parts == {"critic"} else actor_config
        self.device_mesh = fsdp_utils.build_device_mesh(self.world_size, main_config.fsdp.fsdp_size)
        # FSDP shards over all ranks; the Ulysses groups (ref: the actor's size) only split sequences, and the
        # dispatch sends each group one chunk of a batch, so a mini-batch on one rank is its group's share
        # (global_batch_size_per_device already counts per data-parallel group: config/load.py)
        ulysses_size = main_config.ulysses_size
        self.sp = build_sequence_parallel(ulysses_size)
        self.register_dispatch_info(TRAIN_MESH, *dispatch_layout(self.rank, self.world_size, ulysses_size))
        # with the run's chat template (data.override_chat_template, copied to multi_turn.chat_template): the folders
        # this worker saves them into render chats as the run rendered them
        self.tokenizer, self.processor = fsdp_utils.load_tokenizer_and_processor(
            main_config.model, chat_template=self.config.rollout.multi_turn.chat_template
        )
        dp_size = self.device_mesh.size()

        if "actor" in self.parts:
            self.actor_module = self._build_trainable("actor", actor_config, kind="causal_lm")
            self.actor = Actor(
                actor_config,
                self.actor_module,
                self.optimizers["actor"],
                mini_batch_size=actor_config.global_batch_size_per_device,
                dp_size=dp_size,
                processor=self.processor,
                sp=self.sp,
            )
        if "ref" in self.parts:
            ref_config = self.config.ref
            self.ref_module = fsdp_utils.build_fsdp_model(
                actor_config.model, ref_config.fsdp, self.device_mesh, kind="causal_lm", trainable=False,
                default_dtype=torch.bfloat16,
            )  # fmt: skip
            self.ref = Actor(ref_config, self.ref_module, processor=self.processor, sp=self.sp)
        if "rm" in self.parts:
            # the reference's sharding, dtype and micro-batch settings: both are frozen models scored in the same phase
            judge, ref_config = self.config.reward.judge, self.config.ref
            rm_model = ModelConfig(model_path=judge.model_path, enable_gradient_checkpointing=False)
            self.rm_module = fsdp_utils.build_fsdp_model(
                rm_model, ref_config.fsdp, self.device_mesh, kind="reward", trainable=False,
                default_dtype=torch.bfloat16,
            )  # fmt: skip
            rm_tokenizer, _ = fsdp_utils.load_tokenizer_and_processor(rm_model)
            self.reward_model = RewardModel(
                self.rm_module, rm_tokenizer, judge.max_length, ref_config.micro_batch_size_per_device_for_experience
            )
        if "critic" in self.parts:
            self.critic_module = self._build_trainable("critic", critic_config, kind="value")
            self.critic = Critic(
                critic_config,
                self.critic_module,
                self.optimizers["critic"],
                mini_batch_size=critic_config.global_batch_size_per_device,
                dp_size=dp_size,
                processor=self.processor,
                sp=self.sp,
            )
        if "rollout" in self.parts:
            # default layout: every rank is its own data-parallel rollout rank; a tensor-parallel engine re-registers
            self.register_dispatch_info(ROLLOUT_MESH, self.rank, self.world_size, True)
            from .rollout import build_rollout

            self._close_rollout()  # an engine from an earlier init_model may hold the previous actor module
            # the engine starts from the checkpoint folder the actor was loaded from: their weights are equal
            self.rollout = build_rollout(self)
        self._offload_idle()

    def _close_rollout(self) -> None:
        """Drop the rollout, closing what it keeps open (a multi-turn rollout's pooled tool environments)."""
        close = getattr(self.rollout, "close", None)
        self.rollout = None
        if callable(close):
            close()

    def shutdown(self) -> None:
        """Close the rollout's pooled environments (their sandboxes and subprocesses would outlive the killed
        process), then leave the process group."""
        self._close_rollout()
        super().shutdown()

    # ------------------------------------------------------------------------------------------------------------------
    # device placement between phases (GPU only)
    # ------------------------------------------------------------------------------------------------------------------
    def _role_state(self, role: str) -> tuple[torch.nn.Module | None, Any]:
        modules = {"actor": self.actor_module, "ref": self.ref_module, "critic": self.critic_module}
        if role == "rm":  # offloaded as the reference is
            return self.rm_module, self.config.ref.offload
        return modules[role], getattr(self.config, role).offload

    def _offload_idle(self) -> None:
        for role in ("actor", "ref", "critic", "rm"):
            module, offload = self._role_state(role)
            if module is None:
                continue
            if offload.offload_params:
                fsdp_utils.offload_model(module)
            if offload.offload_optimizer and role in self.optimizers:
                fsdp_utils.offload_optimizer(self.optimizers[role])

    @contextmanager
    def _on_device(self, role: str, with_optimizer: bool = False):
        """Bring an offloaded role's parameters (and optimizer states) to the device for the duration."""
        module, offload = self._role_state(role)
        if module is None:
            raise RuntimeError(f"This worker (role `{self.role}`) has no `{role}` model; was init_model called?")
        if offload.offload_params:
            fsdp_utils.load_model(module)
        if with_optimizer and offload.offload_optimizer:
            fsdp_utils.load_optimizer(self.optimizers[role])
        try:
            yield module
        finally:
            if offload.offload_params:
                fsdp_utils.offload_model(module)
            if with_optimizer and offload.offload_optimizer:
                fsdp_utils.offload_optimizer(self.optimizers[role])

    # ------------------------------------------------------------------------------------------------------------------
    # experience
    # ------------------------------------------------------------------------------------------------------------------
    def _with_temperature(self, data: Any) -> Any:
        """Log-probs are scored at the rollout's sampling temperature (the engine's processed log-probs are too)."""
        data.meta_info["temperature"] = self.config.rollout.temperature
        return data

    @register(dispatch_mode=Dispatch.dp_compute_proto(TRAIN_MESH))
    def compute_log_probs(self, data: Any, calculate_entropy: bool = False) -> Any:
        """Actor log-probs of the responses: DataProto with ``old_log_probs`` (and ``entropy`` when
        ``calculate_entropy``), both (batch, response_len) fp32."""
        from ..protocol import DataProto

        data = self._with_temperature(data)
        with self._on_device("actor"):
            log_probs, entropy = self.actor.compute_log_probs(data.to(device.get_torch_device()), calculate_entropy)
        tensors = {"old_log_probs": log_probs.cpu()}
        if entropy is not None:
            tensors["entropy"] = entropy.cpu()
        return DataProto.from_dict(tensors=tensors, meta_info={"temperature": data.meta_info["temperature"]})

    @register(dispatch_mode=Dispatch.dp_compute_proto(TRAIN_MESH))
    def compute_ref_log_probs(self, data: Any) -> Any:
        """Reference-policy log-probs: DataProto with ``ref_log_probs`` (batch, response_len) fp32."""
        from ..protocol import DataProto

        data = self._with_temperature(data)
        if self.ref is None and self.actor_module is not None and lora.has_lora(self.actor_module):
            # the run plan's ref_from_actor: the reference policy is the base weights, the actor without its adapters
            with self._on_device("actor"), lora.adapter_disabled(self.actor_module):
                log_probs, _ = self.actor.compute_log_probs(data.to(device.get_torch_device()))
        else:
            with self._on_device("ref"):
                log_probs, _ = self.ref.compute_log_probs(data.to(device.get_torch_device()))
        return DataProto.from_dict(tensors={"ref_log_probs": log_probs.cpu()})

    @register(dispatch_mode=Dispatch.dp_compute_proto(TRAIN_MESH))
    def compute_values(self, data: Any) -> Any:
        """Critic values of the response tokens: DataProto with ``values`` (batch, response_len) fp32."""
        from ..protocol import DataProto

        with self._on_device("critic"):
            values = self.critic.compute_values(data.to(device.get_torch_device()))
        return DataProto.from_dict(tensors={"values": values.cpu()})

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO, blocking=False)
    def compute_rm_scores(self, data: Any) -> Any:
        """Raw reward-model scores: ``data.non_tensor_batch`` ``rm_prompts`` (str, or a prompt's messages) /
        ``rm_responses`` (str) ->
        DataProto with ``rm_scores`` (batch,) fp32. Non-blocking: the driver's reward scorer starts it and collects
        it while the rule reward is scored; it runs on the workers in the order the driver called."""
        from ..protocol import DataProto

        if self.reward_model is None:
            raise RuntimeError(f"This worker (role `{self.role}`) hosts no reward model.")
        prompts, responses = data.non_tensor_batch["rm_prompts"], data.non_tensor_batch["rm_responses"]
        with self._on_device("rm"):
            texts = [str(p) if isinstance(p, str) else list(p) for p in prompts]  # text or the prompt's messages
            scores = self.reward_model.score(texts, [str(r) for r in responses])
        return DataProto.from_dict(tensors={"rm_scores": scores})

    # ------------------------------------------------------------------------------------------------------------------
    # updates
    # ------------------------------------------------------------------------------------------------------------------
    def _update(self, role: str, data: Any, update_fn) -> Any:
        from ..protocol import DataProto

        scheduler = self.lr_schedulers[role]
        with self._on_device(role, with_optimizer=True):
            metrics = update_fn(data.to(device.get_torch_device()))
        metrics[f"{role}/lr"] = scheduler.get_last_lr()[0]
        if role == "actor":  # the step's vision-tower calls so far: old log-probs, reference, this update
            metrics.update(vision_encoder.take_cache_metrics(self.actor_module, self.ref_module))
        elif role == "critic":  # the values pass and this update
            cache = vision_encoder.take_cache_metrics(self.critic_module)
            metrics.update({vision_encoder.CRITIC_METRIC_NAMES[name]: value for name, value in cache.items()})
        scheduler.step()
        return DataProto.from_dict(meta_info={"metrics": _reduce_metrics_over_ranks(metrics)})

    @register(dispatch_mode=Dispatch.dp_compute_proto(TRAIN_MESH))
    def update_actor(self, data: Any, on_policy: bool = False) -> Any:
        """One policy update on the batch; returns DataProto(meta_info={"metrics": {"actor/...": float}}) with
        metrics averaged over ranks. ``on_policy`` (the run plan's decision): the batch carries no old log-probs and
        the update's own detached log-probs serve as them. The rollout engine keeps the old weights until the
        trainer calls ``sync_rollout_weights``."""
        data = self._with_temperature(data)
        return self._update("actor", data, lambda batch: self.actor.update_policy(batch, on_policy=on_policy))

    @register(dispatch_mode=Dispatch.dp_compute_proto(TRAIN_MESH))
    def update_critic(self, data: Any) -> Any:
        """One value update; returns DataProto(meta_info={"metrics": {"critic/...": float}})."""
        return self._update("critic", data, self.critic.update_critic)

    @register(dispatch_mode=Dispatch.dp_compute_proto(TRAIN_MESH))
    def update_sft(self, data: Any) -> Any:
        """One supervised fine-tuning step of the actor on this rank's conversations (``easyrl sft``: the batch's
        ``response_mask`` marks the assistant's tokens); returns DataProto(meta_info={"metrics": {"sft/...": float}})
        with metrics averaged over ranks."""
        return self._update("actor", data, self.actor.update_sft)

    # ------------------------------------------------------------------------------------------------------------------
    # rollout (hybrid engine)
    # ------------------------------------------------------------------------------------------------------------------
    def iter_full_params_per_layer(self, dtype: torch.dtype | None = None) -> Iterator[list[tuple[str, torch.Tensor]]]:
        """The actor's full weights in per-decoder-layer buckets (a collective: all ranks iterate together)."""
        return fsdp_utils.iter_full_params_per_layer(self.actor_module, dtype)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def sync_rollout_weights(self) -> None:
        """Stream the actor's current weights into the rollout engine, cast layer by layer to the engine's dtype
        (fp32 master weights into a bf16 engine: half the bytes, and no dtype-mismatch loads in the engine).

        With LoRA the engine's route decides (easyrl/workers/rollout/lora_sync.py): "adapter" hands over only the
        gathered adapter tensors (the engine keeps the base weights it loaded); otherwise the merged weights go
        through the same per-layer stream."""
        with self._on_device("actor"):
            engine_dtype = fsdp_utils.to_dtype(self.config.rollout.dtype)
            sync_actor_weights(self.actor_module, self.rollout, engine_dtype)

    @register(dispatch_mode=Dispatch.dp_compute_proto(ROLLOUT_MESH))
    def generate_sequences(self, prompts: Any, request: Any = None) -> Any:
        """Generate responses with the engine's current weights (the trainer syncs them after each actor update);
        ``request``: a ``GenerationRequest`` (validation settings, a sampling override, this call's seed)."""
        if self.rollout is None:
            raise RuntimeError(f"This worker (role `{self.role}`) hosts no rollout engine.")
        wake_up, sleep = getattr(self.rollout, "wake_up", None), getattr(self.rollout, "sleep", None)
        if wake_up is not None:
            wake_up()
        try:
            return self.rollout.generate_sequences(prompts, request)
        finally:
            if sleep is not None:
                sleep()

    # ------------------------------------------------------------------------------------------------------------------
    # checkpoints
    # ------------------------------------------------------------------------------------------------------------------
    def _trainable_role(self) -> str:
        """The one role of this worker that has training state (no role set holds both actor and critic)."""
        trainable = [role for role in ("actor", "critic") if role in self.parts]
        if not trainable:
            raise RuntimeError(f"A `{self.role}` worker has no training state to save or load.")
        return trainable[0]

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def save_checkpoint(self, path: str, save_model_only: bool = False) -> None:
        """DCP-save this worker's trainable role (model, optimizer, lr scheduler, HF config) into folder ``path``."""
        role = self._trainable_role()
        with self._on_device(role, with_optimizer=not save_model_only) as module:
            save_role_checkpoint(
                path,
                module,
                self.optimizers[role],
                self.lr_schedulers[role],
                model_only=save_model_only,
                tokenizer=self.tokenizer,
                processor=self.processor,
                released_dtype=self.released_dtypes.get(role),
            )

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def load_checkpoint(self, path: str, load_model_only: bool = False) -> list[tuple[str, Any, Any]]:
        """Restore this worker's trainable role from folder ``path`` (written by ``save_checkpoint``); the optimizer
        settings the config changed since, ``(name, checkpoint's, config's)``."""
        role = self._trainable_role()
        with self._on_device(role, with_optimizer=not load_model_only) as module:
            return load_role_checkpoint(
                path, module, self.optimizers[role], self.lr_schedulers[role], model_only=load_model_only
            )

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def save_hf_model(self, path: str, role: str = "actor") -> None:
        """Write ``role``'s current weights as a Hugging Face folder at ``path`` (rank 0 writes); with LoRA a peft
        adapter folder (the base model is the model path's, unchanged). The weights are written in the model
        path's dtype."""
        dtype = self.released_dtypes.get(role)
        with self._on_device(role) as module:
            if lora.has_lora(module):
                save_config_folder(path, module, self.tokenizer, self.processor, dtype=dtype)
            else:
                fsdp_utils.save_hf_pretrained(module, path, self.tokenizer, self.processor, dtype=dtype)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL_RANK_ZERO)
    def get_full_state_dict(self, role: str = "actor") -> dict[str, torch.Tensor]:
        """``role``'s full weights as CPU tensors, returned to the driver from rank 0 (small models: tests, tools)."""
        with self._on_device(role) as module:
            return fsdp_utils.get_full_state_dict(module)
