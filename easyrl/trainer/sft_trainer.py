"""`easyrl sft`: supervised fine-tuning of the actor on conversations, on the RL run's workers and checkpoints.

The driver reads and encodes the data before Ray starts (bad rows are named then), starts one worker group in the
`actor` role of ``FSDPWorker`` (the FSDP2 model, optimizer and lr schedule of the actor), and runs one optimizer
step per batch of ``worker.actor.global_batch_size`` conversations. Checkpoints are the RL trainer's
(``global_step_N/actor`` + the loader's position: ``trainer.save_freq``, ``save_limit``, resume from the newest or
``trainer.load_checkpoint_path``), the metrics go to ``trainer.logger``, and the last step's weights are written as a
Hugging Face folder (``SFTPlan.hf_output_dir``) that an RL run takes as ``worker.actor.model.model_path``.
"""

import logging
import os
import time
from collections.abc import Callable
from functools import partial
from typing import Any

from torchdata.stateful_dataloader import StatefulDataLoader

from ..config.sft_plan import SFTPlan
from ..controller.worker_group import WorkerDiedError
from ..data.collate import sft_collate
from ..data.loader import restore_position, say_rows_left_over, stateful_train_loader
from ..data.sft import SFTDataset
from ..utils.logging import setup_driver_logging
from .checkpoint import (
    CheckpointManager,
    CheckpointSaveError,
    load_dataloader_state,
    load_trainer_state,
    model_only_error,
    own_step_row,
    resolve_resume_path,
    saves_after,
    validates_first,
    warn_of_config_changes,
)
from .faults import RunInterrupted, RunStopped, StopRequest, print_interruption, restart_after, resume_hint
from .main import (
    RunSetupError,
    _write_ray_timeline,
    cpus_per_worker,
    draw_curves,
    init_ray,
    run_folder_held,
    setup_errors_reported,
    start_tracker,
)
from .metrics import timer
from .preflight import resume_point


logger = logging.getLogger(__name__)


def build_sft_loader(plan: SFTPlan, tokenizer: Any, processor: Any, model_config: Any) -> StatefulDataLoader:
    """The training conversations in batches of worker.actor.global_batch_size (a resumable loader)."""
    config = plan.config
    dataset = SFTDataset(
        config.data.train_files, tokenizer, processor, config.data, config.sft, model_config=model_config
    )
    batch_size = config.worker.actor.global_batch_size
    if len(dataset) < batch_size:
        raise ValueError(
            f"data.train_files has {len(dataset)} usable conversations, fewer than one batch "
            f"(worker.actor.global_batch_size={batch_size}); lower the batch size or add data."
        )
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    say_rows_left_over(len(dataset), batch_size, "worker.actor.global_batch_size", config.data.shuffle)
    return stateful_train_loader(dataset, batch_size, config.data, partial(sft_collate, pad_token_id=pad))


def build_sft_val_loader(
    plan: SFTPlan, tokenizer: Any, processor: Any, model_config: Any
) -> StatefulDataLoader | None:
    """The conversations of data.val_files in order, data.val_batch_size at a time (-1: all at once); None without
    val_files."""
    config = plan.config
    if not config.data.val_files:
        return None
    dataset = SFTDataset(
        config.data.val_files,
        tokenizer,
        processor,
        config.data,
        config.sft,
        config_key="data.val_files",
        model_config=model_config,
    )
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    batch_size = config.data.val_batch_size if config.data.val_batch_size > 0 else len(dataset)
    return StatefulDataLoader(
        dataset, batch_size=batch_size, shuffle=False, collate_fn=partial(sft_collate, pad_token_id=pad)
    )


class SFTTrainer:
    """The SFT loop: batches -> ``update_sft`` on the workers -> metrics, checkpoints; the HF folder at the end."""

    def __init__(
        self,
        plan: SFTPlan,
        loader: StatefulDataLoader,
        workers: Any,
        tracker: Any,
        stop: StopRequest | None = None,
        val_loader: StatefulDataLoader | None = None,
        restart_workers: Callable[[], Any] | None = None,
    ) -> None:
        """``stop``: read between steps; a stop signal ends the run after the current step, with a checkpoint.
        ``val_loader``: the data.val_files conversations, scored every trainer.val_freq steps and at the end.
        ``restart_workers``: kills the worker group and starts a new one (for ``trainer.max_restarts``)."""
        self.plan, self.config = plan, plan.config
        self.loader, self.workers, self.tracker = loader, workers, tracker
        self.val_loader = val_loader
        self.restart_workers = restart_workers
        self.restarts = 0
        self._initial_loader_state = loader.state_dict()  # where a restart without a checkpoint starts again
        self.stop = stop or StopRequest()
        self.last_checkpoint: str | None = None
        self._saved_step = 0
        trainer = self.config.trainer
        self.checkpoints = CheckpointManager(
            trainer.save_checkpoint_path, trainer.save_limit, trainer.load_checkpoint_path
        )
        self.global_step = 0
        self.epoch = 0

    def _resume(self) -> None:
        """The newest checkpoint of this run (after a worker restart) or the one the config asks for; with none, the
        state the run started from."""
        path = self.last_checkpoint or resolve_resume_path(self.config.trainer)
        if path is None:
            self.loader.load_state_dict(self._initial_loader_state)
            self.global_step = self.epoch = self._saved_step = 0
            self.tracker.rewind_to(-1)
            return
        loader_state = load_dataloader_state(path)
        if loader_state is None:  # checked before Ray starts (check_resume_point); here for a restart's checkpoint
            raise model_only_error(path, "SFT")
        logger.warning("Resuming from %s", path)
        state = load_trainer_state(path)
        changes = self.workers.load_checkpoint(f"{path}/actor")
        warn_of_config_changes(changes, "worker.actor.optim", int(state["global_step"]))
        restore_position(self.loader, loader_state, state.get("train_rows"), path)
        self.global_step, self.epoch = int(state["global_step"]), int(state.get("epoch", 0))
        self.last_checkpoint, self._saved_step = path, self.global_step
        self.tracker.rewind_to(self.global_step, own_step_row(path, self.config.trainer, state))

    def _batches(self):
        while True:
            yield from self.loader
            self.epoch += 1

    def validate(self) -> float:
        """Token-mean cross-entropy of the validation conversations' labelled tokens: the training loss, without an
        update (the actor's log-probs at temperature 1, which the SFT plan fixes)."""
        nll, tokens = 0.0, 0.0
        for batch in self.val_loader:
            log_probs = self.workers.compute_log_probs(batch).batch["old_log_probs"]  # (batch, response_len)
            mask = batch.batch["response_mask"]
            nll -= float((log_probs * mask).sum())
            tokens += float(mask.sum())
        return nll / tokens

    def save_checkpoint(self, metrics: dict[str, float]) -> str:
        model_only = self.config.trainer.save_model_only
        with self.checkpoints.saving(self.global_step) as tmp_dir:  # a failed write: CheckpointSaveError, as in RL
            self.workers.save_checkpoint(f"{tmp_dir}/actor", model_only)
            self.last_checkpoint = self.checkpoints.commit(
                self.global_step,
                trainer_state={"epoch": self.epoch, "metrics": metrics, "train_rows": len(self.loader.dataset)},
                dataloader_state=None if model_only else self.loader.state_dict(),
                required=("actor",),
            )
        self._saved_step = self.global_step
        self._last_save_time = time.monotonic()
        return self.last_checkpoint

    def fit(self) -> dict[str, float]:
        """Train to the last step, save, and write the Hugging Face folder; returns the last step's metrics.

        A worker that dies ends the run naming it (``WorkerDied``) or, while ``trainer.max_restarts`` allows, the
        group is started again and the run resumes from the last complete checkpoint, as in RL."""
        while True:
            try:
                return self._train()
            except CheckpointSaveError as error:  # printed as one line: say where the run can go on from
                error.add_note(resume_hint(self.last_checkpoint, self.config.trainer))
                raise
            except WorkerDiedError as died:
                self.restarts = restart_after(died, self)
                self.workers = self.restart_workers()

    def _train(self) -> dict[str, float]:
        self._resume()
        steps = self.plan.training_steps
        metrics: dict[str, float] = {}
        trainer_config = self.config.trainer
        if self.val_loader is not None and validates_first(trainer_config, self.global_step):
            metrics = {"val/loss": self.validate()}  # the starting point of the validation curve, as RL logs it
            self.tracker.log(metrics, step=0)
        if trainer_config.val_only:
            return metrics
        batches = self._batches()
        self._last_save_time = time.monotonic()
        while self.global_step < steps:
            if self.stop.requested:
                if self.global_step > self._saved_step:
                    self.save_checkpoint(metrics)
                hint = resume_hint(self.last_checkpoint, self.config.trainer)
                raise RunStopped(self.stop.signal_name, self.stop.signum, self.global_step, self.last_checkpoint, hint)
            self.global_step += 1
            timing: dict[str, float] = {}
            with timer("step", timing):
                batch = next(batches)
                output = self.workers.update_sft(batch)
            metrics = dict(output.meta_info["metrics"])
            metrics["sft/tokens"] = float(batch.batch["response_mask"].sum())
            metrics["sft/epoch"] = float(self.epoch)
            metrics["trainer/restarts"] = float(self.restarts)
            metrics.update({f"timing/{key}": value for key, value in timing.items()})
            val_freq = self.config.trainer.val_freq
            if self.val_loader is not None and (
                self.global_step == steps or (val_freq > 0 and self.global_step % val_freq == 0)
            ):
                metrics["val/loss"] = self.validate()
            if saves_after(
                trainer_config, self.global_step, self.global_step == steps, self._last_save_time, self.stop.requested
            ):
                self.save_checkpoint(metrics)
            self.tracker.log(metrics, step=self.global_step)
        adapter_dir = self.plan.adapter_output_dir
        if adapter_dir is None:
            self.workers.save_hf_model(self.plan.hf_output_dir)
            return metrics
        # LoRA: the workers write the adapters; the driver merges them into the base, so the model folder is one an
        # RL run loads as it is (transformers cannot load an adapter folder as a model)
        from ..workers.fsdp_checkpoint import merge_adapter_folder

        self.workers.save_hf_model(adapter_dir)
        merge_adapter_folder(adapter_dir, self.config.worker.actor.model.model_path, self.plan.hf_output_dir)
        return metrics


def run_sft(plan: SFTPlan) -> dict[str, float]:
    """`easyrl sft`: data and model read before Ray, then the workers, the loop and the Hugging Face folder."""
    with run_folder_held(plan.config.trainer.save_checkpoint_path):
        return _run_sft(plan)


def _run_sft(plan: SFTPlan) -> dict[str, float]:
    from ..config import config_to_dict, config_to_yaml
    from ..config.validate import check_model_sources
    from ..controller.resource_pool import ResourcePool
    from ..controller.worker_group import RayWorkerGroup
    from ..data.dataset import SKIPPED_ROWS_FILE, write_skipped_rows
    from ..data.tokenizer import load_tokenizer_and_processor
    from ..demo.builtin_models import resolve_model_path
    from ..models.hf_config import load_hf_config
    from ..workers.fsdp_worker import FSDPWorker
    from .run_config import record_run_config

    config = plan.config
    log_file = setup_driver_logging(config.trainer.save_checkpoint_path)
    model = config.worker.actor.model
    with setup_errors_reported(log_file):
        check_model_sources(config)
        model.model_path = resolve_model_path(model.model_path)
        model.tokenizer_path = resolve_model_path(model.tokenizer_path)
        tokenizer, processor = load_tokenizer_and_processor(model.tokenizer_path, model.trust_remote_code)
        model_config = load_hf_config(model, "causal_lm")
        loader = build_sft_loader(plan, tokenizer, processor, model_config)
        val_loader = build_sft_val_loader(plan, tokenizer, processor, model_config)
        write_skipped_rows(
            os.path.join(config.trainer.save_checkpoint_path, SKIPPED_ROWS_FILE),
            [loader.dataset, val_loader and val_loader.dataset],
        )
        plan = plan.with_training_steps(len(loader))
    try:  # no checkpoint to resume from, or a fresh start among an earlier run's: one line, before Ray starts
        resumed_from = resume_point(config, "SFT")  # what `easyrl check sft` and `easyrl train` read too
    except ValueError as error:
        raise RunSetupError(str(error)) from error
    logger.info("SFT plan:\n%s", plan.describe())
    val_only = config.trainer.val_only
    record_run_config(
        config.trainer.save_checkpoint_path,
        config_to_yaml(config),
        "SFT validation" if val_only else "SFT run",
        resumed_from,
        val_only,
    )
    with setup_errors_reported(log_file):  # a tracker that cannot start its run: one line, before Ray starts
        tracker = start_tracker(config, config_to_dict(config), plan.training_steps)
    try:
        init_ray(plan)
    except BaseException:
        tracker.finish()
        raise
    pool = ResourcePool.from_trainer_config(
        config.trainer.nnodes,
        config.trainer.n_gpus_per_node,
        max_colocate_count=1,
        cpus_per_worker=cpus_per_worker(plan, 1),
    )
    groups: list[Any] = []
    interrupted = None

    def start_group() -> Any:
        groups.append(
            RayWorkerGroup(
                pool, FSDPWorker, config.worker, "actor", config.trainer.save_checkpoint_path, name_prefix="sft"
            )
        )
        groups[-1].init_model()
        return groups[-1]

    def restart_group() -> Any:
        groups.pop().kill(graceful_timeout_s=2.0)  # the survivors are idle or stuck in a collective
        return start_group()

    # after ray.init, whose own SIGTERM handler would tear the cluster down at once
    with StopRequest().installed() as stop:
        pool.while_waiting = stop.raise_if_requested  # a stop while the workers wait for the cluster's resources
        try:
            stop.starting = True
            first_group = start_group()
            stop.starting = False
            trainer = SFTTrainer(plan, loader, first_group, tracker, stop, val_loader, restart_group)
            metrics = trainer.fit()
        except RunInterrupted as error:
            interrupted = error
        finally:
            try:
                _write_ray_timeline(config.trainer.ray_timeline)
            finally:
                for group in groups:
                    group.kill()
                pool.release()
                tracker.finish()
    if interrupted is not None:
        draw_curves(config.trainer)
        print_interruption(interrupted)
        raise SystemExit(interrupted.exit_code)
    if config.trainer.val_only:  # nothing was trained, so no checkpoint and no model was written
        print(
            f"Validated only (trainer.val_only): no model was written; the scores are in {config.trainer.save_checkpoint_path}"
        )
        draw_curves(config.trainer, summary=True)
        return metrics
    print(f"Checkpoints are in {config.trainer.save_checkpoint_path}")
    draw_curves(config.trainer, summary=True)
    print(f"The fine-tuned model is in {plan.hf_output_dir} (use it as worker.actor.model.model_path)")
    if plan.adapter_output_dir is not None:
        print(
            f"It is the base model with the LoRA adapters merged in; the adapters alone are in {plan.adapter_output_dir}"
        )
    return metrics
