"""A generative judge on a vLLM engine of its own (`worker.reward.judge.kind=vllm`).

The engine runs in one Ray actor, started with the run (before the first step) and apart from the training workers:
it never sleeps, never receives weights, and on GPU holds a device share of its own (`judge.num_gpus`,
`judge.gpu_memory_utilization`); with `num_gpus: 0` it runs on vLLM's CPU backend. The driver talks to it as to the
HTTP judge (judge.py), so the scorer overlaps it with the rule reward the same way:

    judge = VllmJudge(config.worker.reward.judge)
    pending = judge.submit(prompts, reward_inputs)      # the whole batch goes to the engine at once
    ...                                                 # the rule reward is scored meanwhile
    verdicts = judge.collect(pending)                   # list[JudgeResult], failures counted and logged once

Each sample's message is the same Jinja judge template as for `http`, sent through the judge model's chat template as
one user turn when its tokenizer has one (as a chat server would), else as plain text. The replies are read with
`score_pattern` / `score_range` by judge.read_verdict, like the HTTP judge's: a reply cut at `max_tokens` or without
a score in range scores 0 and counts in reward/judge_errors, and so does a message longer than the judge model's
context (vLLM would refuse the whole batch for one such prompt). A dead engine stops the run (or, under
trainer.max_restarts, is restarted with the workers); an exception its `generate` raises stops it too, named as that
exception: the engine lives on, and a restart would only meet it again.
"""

import functools
import hashlib
import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Optional

import ray
from ray.exceptions import GetTimeoutError, RayError, RayTaskError

from ...controller.worker_group import describe_death
from ...demo.builtin_models import resolve_model_path
from ...utils import device
from ...utils.logging import setup_worker_logging
from ..rollout.vllm_rollout import (
    MAX_REQUEST_SEED,
    VLLM_DTYPES,
    _cpu_engine_environment,
    check_cpu_head_size,
    kv_cache_kwargs,
)
from .judge import (
    REQUEST_FAILED,
    JudgeEngineDied,
    JudgeEngineError,
    JudgeFailure,
    JudgeResult,
    SilentJudgeWatch,
    compile_score_pattern,
    load_template,
    read_verdict,
    render_messages,
    report_failures,
)


if TYPE_CHECKING:
    from ...config.schema import JudgeConfig

logger = logging.getLogger(__name__)

JUDGE_SEED = 0  # the engine's own seed; each request samples with message_seed's


def message_seed(ids: list[int]) -> int:
    """The sampling seed of one judge message, from its token ids: a judge sampling at temperature > 0 grades the
    same message the same way whatever the batch, its place in it, or how many batches the engine judged before (an
    engine restarted on a resume starts over; one seed for the engine would give each message the draws of its place
    in the engine's history)."""
    digest = hashlib.blake2b(repr(ids).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") % MAX_REQUEST_SEED


STARTUP_TIMEOUT_S = 600.0
LOG_GROUP = "judge_engine"  # its output goes to <run_dir>/logs/judge_engine_0.log


@ray.remote
class JudgeEngine:
    """The vLLM engine of a judge model; `generate` returns one (reply, cut, refusal) per message: the reply text,
    whether it stopped at max_tokens, and why it was not generated (None when it was)."""

    def __init__(self, config: "JudgeConfig", run_dir: Optional[str] = None):
        if run_dir is not None:  # vLLM's and the libraries' output to the run's logs, before vLLM is imported
            setup_worker_logging(run_dir, 0, group=LOG_GROUP)

        cuda = device.is_cuda_available()
        kwargs = {
            "dtype": VLLM_DTYPES[config.dtype],
            "seed": JUDGE_SEED,
            "enforce_eager": not cuda,  # CUDA graphs on GPU; a CPU has none
            "gpu_memory_utilization": config.gpu_memory_utilization,
            "disable_log_stats": True,
        }
        kwargs.update(kv_cache_kwargs(config.kv_cache_memory_bytes))  # judge prompts share their template's blocks
        if config.max_model_len is not None:
            kwargs["max_model_len"] = config.max_model_len
        path = resolve_model_path(config.model_path)
        with _cpu_engine_environment():
            from vllm import LLM, SamplingParams

            self.llm = LLM(model=path, **kwargs)
        if not cuda:
            way_out = "Serve the judge elsewhere (worker.reward.judge.kind=http with base_url)"
            check_cpu_head_size(self.llm.llm_engine.model_config.get_head_size(), path, "judge engine", way_out)
        self.sampling = functools.partial(SamplingParams, temperature=config.temperature, max_tokens=config.max_tokens)
        self.tokenizer = self.llm.get_tokenizer()
        self.max_model_len = self.llm.llm_engine.model_config.max_model_len

    def ready(self) -> bool:
        return True

    def encode(self, message: str) -> list[int]:
        """The message's token ids: one user turn of the judge model's chat template with the assistant's turn
        opened, or the plain text (with the tokenizer's own special tokens) when it has no chat template."""
        if getattr(self.tokenizer, "chat_template", None):
            text = self.tokenizer.apply_chat_template(
                [{"role": "user", "content": message}], tokenize=False, add_generation_prompt=True
            )
            return self.tokenizer(text, add_special_tokens=False)["input_ids"]
        return self.tokenizer(message)["input_ids"]

    def generate(self, messages: list[str]) -> list[tuple[str, bool, Optional[str]]]:
        ids = [self.encode(message) for message in messages]
        fits = [i for i, row in enumerate(ids) if len(row) < self.max_model_len]
        sampling = [self.sampling(seed=message_seed(ids[i])) for i in fits]
        outputs = self.llm.generate([{"prompt_token_ids": ids[i]} for i in fits], sampling, use_tqdm=False)
        replies: list[tuple[str, bool, Optional[str]]] = [
            (
                "",
                False,
                f"the judge message has {len(row)} tokens; the judge model takes {self.max_model_len - 1} at most",
            )
            for row in ids
        ]
        for i, output in zip(fits, outputs, strict=True):
            completion = output.outputs[0]
            replies[i] = (completion.text, completion.finish_reason == "length", None)
        return replies


def read_replies(pending: "ray.ObjectRef", model_path: Optional[str]) -> list:
    """What the engine's `generate` returned for a submitted batch. An exception it raised (a RayTaskError: the actor
    lives on) is a JudgeEngineError naming that exception: the same batch, or a resumed run's, would raise it again,
    so no restart can help. Only an engine whose process is gone is JudgeEngineDied, which trainer.max_restarts
    restarts."""
    try:
        return ray.get(pending)
    except RayTaskError as err:
        cause = err.cause if err.cause is not None else err
        raise JudgeEngineError(
            f"The judge engine (worker.reward.judge.model_path={model_path}) raised {type(cause).__name__} while "
            f"judging a batch: {str(cause).strip()}. The engine did not die, and restarting it (trainer.max_restarts) "
            "would meet the same error: fix the judge model or its settings (worker.reward.judge.*)."
        ) from err
    except RayError as err:
        raise JudgeEngineDied(
            f"the judge engine (worker.reward.judge.model_path={model_path}) died while judging a batch: "
            f"{describe_death(err)}"
        ) from err


class VllmJudge:
    """The driver's side of the judge engine: renders the messages, hands a batch to the engine (`submit`), and
    reads the replies into verdicts (`collect`)."""

    def __init__(
        self, config: "JudgeConfig", run_dir: Optional[str] = None, startup_timeout_s: float = STARTUP_TIMEOUT_S
    ):
        """`run_dir`: the run's folder, whose logs/judge_engine_0.log gets the engine's output (None: the console)."""
        self.config = config
        self.template = load_template(config.prompt_template)
        self.pattern = compile_score_pattern(config.score_pattern)
        self.name = f"Judge engine {config.model_path}"
        self._logged: set[str] = set()
        self.watch = SilentJudgeWatch(
            f"The judge engine (worker.reward.judge.model_path={config.model_path})",
            ["worker.reward.judge.model_path (a model that answers in the template's format)"],
            config.timeout_s,
        )
        self.run_dir, self.startup_timeout_s = run_dir, startup_timeout_s
        self.engine = self._start_engine()

    def _start_engine(self) -> Any:
        config, timeout_s = self.config, self.startup_timeout_s
        # one CPU drives the engine (on CPU its vLLM backend computes with it); a GPU share when num_gpus > 0
        engine = JudgeEngine.options(num_cpus=1, num_gpus=config.num_gpus).remote(config, self.run_dir)
        try:
            ray.get(engine.ready.remote(), timeout=timeout_s)
        except GetTimeoutError:
            ray.kill(engine, no_restart=True)
            raise JudgeEngineError(
                f"The judge engine (worker.reward.judge.model_path={config.model_path}) did not start within "
                f"{timeout_s:g} s. Its actor needs 1 CPU and worker.reward.judge.num_gpus={config.num_gpus:g} "
                f"GPUs besides the training workers' (free now: {ray.available_resources()}); give Ray more, or "
                "lower worker.reward.judge.num_gpus."
            ) from None
        except RayError as err:
            advice = ""
            if "KV cache" in str(err) or "max seq len" in str(err):  # vLLM's advice names its own arguments
                advice = (
                    " The KV cache must hold one request of the engine's context: set worker.reward.judge.max_model_len "
                    "to what a judge message and its reply need, or give the engine more memory "
                    "(worker.reward.judge.kv_cache_memory_bytes; on a GPU, worker.reward.judge.gpu_memory_utilization)."
                )
            raise JudgeEngineError(
                f"The judge engine (worker.reward.judge.model_path={config.model_path}) failed to start: {err}{advice}"
            ) from err
        return engine

    def restart(self) -> None:
        """A new engine in place of one that died (`JudgeEngineDied`, trainer.max_restarts)."""
        ray.kill(self.engine, no_restart=True)
        self.engine = self._start_engine()

    def submit(self, prompts: Sequence[str], inputs: Sequence[dict]) -> "ray.ObjectRef":
        """Start judging one batch (`prompts[i]` with the reward input `inputs[i]`); `collect` reads the result."""
        return self.engine.generate.remote(render_messages(self.template, prompts, inputs))

    def collect(self, pending: "ray.ObjectRef", places: Any = None) -> list[JudgeResult]:
        """The verdicts of a submitted batch, in order, the first failure of each kind logged once per run; raises
        JudgeUnreachableError when no sample of the first batch, or of JUDGE_SILENT_STREAK batches in a row, got a
        score (as the http judge does)."""
        replies = read_replies(pending, self.config.model_path)
        verdicts = [
            JudgeResult(0.0, JudgeFailure(REQUEST_FAILED, refusal))
            if refusal is not None
            else read_verdict(reply, cut, self.pattern, self.config)
            for reply, cut, refusal in replies
        ]
        report_failures(verdicts, self._logged, self.name, places)
        self.watch.check(verdicts)
        return verdicts

    def score(self, prompts: Sequence[str], inputs: Sequence[dict]) -> list[JudgeResult]:
        return self.collect(self.submit(prompts, inputs))

    def close(self) -> None:
        ray.kill(self.engine, no_restart=True)
