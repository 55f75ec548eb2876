"""An LLM judge reached over HTTP (`worker.reward.judge.kind=http`): any OpenAI-compatible chat-completions endpoint
(`vllm serve`, SGLang, OpenAI). Its score joins the rule reward with weights:

    overall = worker.reward.rule_weight * rule overall + worker.reward.judge.weight * judge score

    judge = HttpJudge(config.worker.reward.judge)
    pending = judge.submit(prompts, reward_inputs)       # starts at once, on the judge's own event loop thread
    ...                                                  # the rule reward is scored meanwhile
    scores, judge_errors = combine_scores(rule_scores, pending.result(), rule_weight, judge_weight)

Each sample is one request: the Jinja template (`prompt_template`, rendered with `prompt`, `response`,
`ground_truth`) as the user message. The reply's text is read with `score_pattern` (the group of its LAST match), and
the number is mapped from `score_range` onto [0, 1]. At most `concurrency` requests are in flight. A connection
error, HTTP 429 or a 5xx status is retried up to `max_retries` times after a random wait of up to
`retry_backoff_s * 2**attempt` (exponential backoff with full jitter; a longer Retry-After is honoured).

A sample's judge score is 0 and the sample is counted in `reward/judge_errors` when its request failed (after the
retries, or at once on another 4xx status), took longer than `timeout_s`, or its reply could not be read as a score
in `score_range` (no match, a number outside the range, a reply cut at `max_tokens`); the first failure of each kind
is logged once with the sample's index. The step goes on. Two exceptions, where the judge is not usable at all:
when NO sample of the first batch the judge sees gets a score, whatever the failures (connection refused, 401/404,
every request timed out, an HTML page or another non-chat reply, replies that never match score_pattern: a wrong
base_url, model, key or pattern), or when no sample of JUDGE_SILENT_STREAK batches in a row gets one later (the judge
went down), `JudgeUnreachableError` (a RewardFunctionError) stops the run with the failures counted and the first one,
instead of training on a judge share that is 0 for every sample.

Torch-free: the config check imports the template and pattern helpers from here.
"""

import asyncio
import concurrent.futures
import json
import logging
import math
import os
import random
import re
import socket
import threading
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional
from urllib.parse import urlsplit

import httpx
import jinja2
import jinja2.meta

from .loader import FAILED_BATCH_STREAK, RewardFunctionError


if TYPE_CHECKING:
    from ...config.schema import JudgeConfig
    from ...protocol import DataProto

logger = logging.getLogger(__name__)

TEMPLATE_VARIABLES = ("prompt", "response", "ground_truth")
# The built-in judge prompt (prompt_template: null): a 0-10 grade against the reference answer, the grade last.
DEFAULT_TEMPLATE = """\
You are grading an answer to a question. Compare it with the reference answer and judge whether it is correct and \
well reasoned.

Question:
{{ prompt }}

Reference answer:
{{ ground_truth }}

Answer to grade:
{{ response }}

Explain your grade in at most three sentences. Then write the grade, an integer from 0 (wrong) to 10 (fully \
correct), alone on the last line as `Score: N`."""
MAX_RETRY_WAIT_S = 60.0  # the longest wait between two attempts, whatever Retry-After or the backoff say
CHAT_PATH = "/chat/completions"

# why a sample's judge score is 0
REQUEST_FAILED = "request failed"  # no usable HTTP reply: connection errors, 4xx, 5xx/429 after the retries
TIMED_OUT = "timed out"
UNPARSABLE = "unparsable"


# batches in a row with no score at all that stop a run whose judge scored before
JUDGE_SILENT_STREAK = FAILED_BATCH_STREAK
# how each failure kind reads in JudgeUnreachableError's count
FAILURE_COUNTS = {
    REQUEST_FAILED: "got no usable HTTP reply",
    TIMED_OUT: "timed out after worker.reward.judge.timeout_s={timeout_s:g} s",
    UNPARSABLE: "had no readable score",
}


def unreachable_judge(config: Any, timeout_s: float = 3.0) -> Optional[str]:
    """Why nothing answers at the http judge's host and port now (a TCP connection, before Ray starts), or None
    (it answers, or the judge is not an http one). A warning, not a refusal: a job may start its judge server beside
    the run, and the run itself stops at the first batch the judge does not score."""
    if config.kind != "http" or not config.base_url:
        return None
    url = urlsplit(config.base_url)
    try:
        port = url.port or (443 if url.scheme == "https" else 80)
    except ValueError as error:  # a port that is not a number: the run's first request says the same
        return str(error)
    try:
        with socket.create_connection((url.hostname or "", port), timeout=timeout_s):
            return None
    except OSError as error:
        return (
            f"nothing answers at {url.hostname}:{port} (worker.reward.judge.base_url={config.base_url}) now: "
            f"{error.strerror or error}. The run goes on, and stops at the first batch the judge does not score; "
            "start the judge server, or fix the URL."
        )


class JudgeEngineError(RuntimeError):
    """The judge engine could not start, raised while judging a batch, or died (`worker.reward.judge.kind=vllm`;
    judge_engine.py). Defined here, with the judges' other errors, so that the driver names it without importing the
    engine's module (vLLM's helpers)."""


class JudgeEngineDied(JudgeEngineError):
    """The judge engine's process died while the run went on (killed, out of memory, crashed): under
    `trainer.max_restarts` the run restarts its workers and the engine and resumes, as when a training worker dies."""


class JudgeUnreachableError(RewardFunctionError):
    """No sample of the judge's first batch (or of JUDGE_SILENT_STREAK batches in a row) got a score: a wrong
    `worker.reward.judge.base_url`, model, key or score_pattern, or a judge that went down. A RewardFunctionError, so
    that `easyrl train` prints its message alone and exits 2; the message names the judge and what to check."""


@dataclass(frozen=True)
class JudgeFailure:
    kind: str  # REQUEST_FAILED, TIMED_OUT or UNPARSABLE
    detail: str


@dataclass(frozen=True)
class JudgeResult:
    """One sample's verdict: `score` in [0, 1] (0 where `failure` says why it could not be had) and the reply."""

    score: float
    failure: Optional[JudgeFailure] = None
    reply: Optional[str] = None


# ----------------------------------------------------------------------------------------------------------------------
# template, pattern, score: shared with the config check
# ----------------------------------------------------------------------------------------------------------------------
def template_source(path: Optional[str]) -> str:
    return DEFAULT_TEMPLATE if path is None else Path(path).expanduser().read_text(encoding="utf-8")


def load_template(path: Optional[str]) -> jinja2.Template:
    """The judge prompt template (the built-in one for None). Raises ValueError naming the problem when it does not
    parse, uses a variable other than prompt/response/ground_truth, or never shows the response."""
    source = template_source(path)
    environment = jinja2.Environment(undefined=jinja2.StrictUndefined, keep_trailing_newline=True)
    try:
        variables = jinja2.meta.find_undeclared_variables(environment.parse(source))
    except jinja2.TemplateSyntaxError as err:
        raise ValueError(f"it is not a valid Jinja template (line {err.lineno}: {err.message})") from None
    unknown = sorted(variables - set(TEMPLATE_VARIABLES))
    if unknown:
        raise ValueError(f"it uses {unknown}; a judge template may use only {', '.join(TEMPLATE_VARIABLES)}")
    if "response" not in variables:
        raise ValueError("it never uses `{{ response }}`: the judge would not see the answer it grades")
    template = environment.from_string(source)
    try:  # filters and tests fail only when rendered
        template.render(prompt="2 + 3 = ?", response="5", ground_truth="5")
    except Exception as err:  # any template error: the user's file, not easyrl
        raise ValueError(f"it does not render with sample values ({type(err).__name__}: {err})") from None
    return template


def compile_score_pattern(pattern: str) -> re.Pattern:
    """The score regex; ValueError when it does not compile or has not exactly one group."""
    try:
        compiled = re.compile(pattern)
    except re.error as err:
        raise ValueError(f"it is not a valid regular expression ({err})") from None
    if compiled.groups != 1:
        raise ValueError(f"it has {compiled.groups} groups; it needs exactly one, around the number")
    return compiled


def parse_score(reply: str, pattern: re.Pattern, score_range: Sequence[float]) -> float:
    """The group of the pattern's last match in ``reply`` as a number in ``score_range``, mapped onto [0, 1].
    ValueError (its message says why) when there is no match, no number, or a number outside the range."""
    matches = list(pattern.finditer(reply))
    if not matches:
        raise ValueError(f"no match of score_pattern {pattern.pattern!r}")
    text = matches[-1].group(1)
    try:
        value = float(text)
    except (TypeError, ValueError):
        raise ValueError(f"the match {text!r} is not a number") from None
    low, high = float(score_range[0]), float(score_range[1])
    if not (math.isfinite(value) and low <= value <= high):
        raise ValueError(f"{text} is outside score_range [{low:g}, {high:g}]")
    return (value - low) / (high - low)


def combine_scores(
    rule_scores: list[dict[str, float]], verdicts: list[JudgeResult], rule_weight: float, judge_weight: float
) -> tuple[list[dict[str, float]], list[float]]:
    """Per-sample score dicts with `overall` = rule_weight x rule overall + judge_weight x judge score, the rule's
    own `overall` as `rule` and the judge's score as `judge` (other named scores kept), and per-sample 1.0 where the
    judge failed."""
    combined = []
    for score, verdict in zip(rule_scores, verdicts, strict=True):
        clash = [name for name in ("rule", "judge", "judge_errors") if name in score]
        if clash:
            raise RewardFunctionError(
                f"The reward function returned a score named `{clash[0]}`, which the judge's scores use "
                f"(reward/rule, reward/judge, reward/judge_errors); rename that score."
            )
        overall = rule_weight * score["overall"] + judge_weight * verdict.score
        combined.append({**score, "overall": overall, "rule": score["overall"], "judge": verdict.score})
    return combined, [float(verdict.failure is not None) for verdict in verdicts]


def render_messages(template: jinja2.Template, prompts: Sequence, inputs: Sequence[dict]) -> list[str]:
    """The judge's user message for each sample: `prompts[i]` (text, or messages: see `question_text`) with the reward
    input `inputs[i]`. A ground truth that is not text (a jsonl row's object or list, e.g. code tests) is shown as
    JSON, not as Python's repr of it."""
    return [
        template.render(
            prompt=question_text(prompt), response=item["response"], ground_truth=_as_text(item["ground_truth"])
        )
        for prompt, item in zip(prompts, inputs, strict=True)
    ]


def _as_text(value: Any) -> Any:
    if isinstance(value, (dict, list, tuple)):
        try:
            return json.dumps(value, ensure_ascii=False)
        except (TypeError, ValueError):  # not JSON's (e.g. bytes inside): as Python writes it
            return str(value)
    return value


def read_verdict(reply: str, cut: bool, pattern: re.Pattern, config: "JudgeConfig") -> JudgeResult:
    """A judge reply's verdict, the same for every kind that generates text: a reply `cut` at max_tokens (it never
    reached the score it was asked to end with) or with no score in score_range is UNPARSABLE."""
    if cut:
        detail = f"the reply was cut at max_tokens={config.max_tokens} before its end: {reply[-200:]!r}"
        return JudgeResult(0.0, JudgeFailure(UNPARSABLE, detail), reply)
    try:
        return JudgeResult(parse_score(reply, pattern, config.score_range), None, reply)
    except ValueError as err:
        return JudgeResult(0.0, JudgeFailure(UNPARSABLE, f"{err} in the reply {reply[-300:]!r}"), reply)


def sample_label(index: int, places: Any = None) -> str:
    """A sample of a batch as the judges' warnings name it: its index, and where its row is in the data when known."""
    return f"sample {index}" + (f" ({places[index]})" if places is not None else "")


def report_failures(verdicts: list[JudgeResult], logged: set[str], judge: str, places: Any = None) -> None:
    """Log the first failure of each kind once per run (`logged` holds the kinds done), naming the sample's index in
    its batch and, with ``places``, its row in the data; `judge` names the judge (its URL or model)."""
    for kind in (REQUEST_FAILED, TIMED_OUT, UNPARSABLE):
        indices = [i for i, verdict in enumerate(verdicts) if verdict.failure and verdict.failure.kind == kind]
        if not indices or kind in logged:
            continue
        logged.add(kind)
        logger.warning(
            "%s: %s %s: %s. %d of %d samples of this batch get judge score 0 (counted in reward/judge_errors; "
            "logged once).",
            judge,
            sample_label(indices[0], places),
            kind,
            verdicts[indices[0]].failure.detail,
            len(indices),
            len(verdicts),
        )


class SilentJudgeWatch:
    """Both judges' (http, vllm) stop rule: no sample of the first batch, or of JUDGE_SILENT_STREAK batches in a row,
    got a score. A judge share that is 0 for every sample would otherwise train on the rule reward alone, silently."""

    def __init__(self, who: str, checks: list[str], timeout_s: float, went_silent: str = ""):
        """``who``: the judge as the message names it; ``checks``: the keys to check whatever failed (the pattern's
        and the timeout's are added when replies were unreadable or late); ``went_silent``: what to ask when a judge
        that scored earlier batches stops scoring."""
        self.who, self.checks, self.timeout_s, self.went_silent = who, checks, timeout_s, went_silent
        self.batches_scored = 0
        self.silent_streak = 0  # batches in a row (since the last with a score) in which no sample got a score

    def check(self, verdicts: list[JudgeResult]) -> None:
        """Count a collected batch; raise JudgeUnreachableError when the judge is not usable."""
        first_batch = self.batches_scored == 0
        self.batches_scored += 1
        if not verdicts or any(verdict.failure is None for verdict in verdicts):
            self.silent_streak = 0
            return
        self.silent_streak += 1
        if first_batch or self.silent_streak >= JUDGE_SILENT_STREAK:
            raise JudgeUnreachableError(self._message(verdicts, first_batch))
        # a judge that scored earlier batches went silent: said at once (its failures were logged once per run),
        # not only when the streak stops the run
        first = verdicts[0].failure
        logger.warning(
            "%s gave a score to no sample of this batch (%d; the first failure, %s: %s); the run stops after %d such "
            "batches in a row (this is %d).",
            self.who,
            len(verdicts),
            first.kind,
            first.detail[:200],
            JUDGE_SILENT_STREAK,
            self.silent_streak,
        )

    def _message(self, verdicts: list[JudgeResult], first_batch: bool) -> str:
        kinds = Counter(verdict.failure.kind for verdict in verdicts)
        counted = ", ".join(
            f"{count} {FAILURE_COUNTS[kind].format(timeout_s=self.timeout_s)}" for kind, count in kinds.items()
        )
        first = verdicts[0].failure
        when = (
            f"the {len(verdicts)} samples of its first batch"
            if first_batch
            else f"the samples of {JUDGE_SILENT_STREAK} batches in a row (the last had {len(verdicts)}; it scored "
            f"earlier batches{': ' + self.went_silent if self.went_silent else ''})"
        )
        checks = list(self.checks)
        if TIMED_OUT in kinds:
            checks.append("that the server answers at all (a slow judge needs a larger worker.reward.judge.timeout_s)")
        if UNPARSABLE in kinds:
            checks.append(
                "worker.reward.judge.score_pattern and score_range against the replies (and max_tokens, prompt_template)"
            )
        return (
            f"{self.who} gave a score to none of {when}: {counted}. The first failure ({first.kind}): "
            f"{first.detail[:300]}. Check {'; '.join(checks)}."
        )


def judge_prompts(data: "DataProto", tokenizer, skip_special_tokens: bool = True) -> list:
    """What a judge is shown of each sample's prompt: its chat messages before the chat template (format_prompt and
    system_prompt applied, as text) where the data carries them (``prompt_messages``, when a judge is on), else the
    prompt decoded (an environment's reset prompts): a grader reads the question, not the policy's template."""
    from ...data.dataset import PROMPT_MESSAGES_KEY

    carried = data.non_tensor_batch.get(PROMPT_MESSAGES_KEY)
    if carried is None or any(messages is None for messages in carried):
        return decode_prompts(data, tokenizer, skip_special_tokens)
    return [list(messages) for messages in carried]


def question_text(prompt: "str | list[dict]") -> str:
    """A judge template's `prompt`: the last user message's text of a prompt given as messages, else the text."""
    if isinstance(prompt, str):
        return prompt
    users = [message["content"] for message in prompt if message["role"] == "user"]
    return users[-1] if users else "\n\n".join(message["content"] for message in prompt)


def decode_prompts(data: "DataProto", tokenizer, skip_special_tokens: bool = True) -> list[str]:
    """Each sample's prompt as the policy saw it (format_prompt and chat template applied), decoded from the
    rollout's left-padded `prompts` with their part of `attention_mask` (special tokens, image pads among them,
    removed with skip_special_tokens)."""
    if "prompts" not in data.batch.keys():
        raise KeyError("The batch has no `prompts` tensor (the rollout's prompt ids) for the judge's `prompt`.")
    prompts = data.batch["prompts"]  # (batch, prompt_len), left-padded
    mask = data.batch["attention_mask"][:, : prompts.shape[1]].bool()
    ids = [row[keep].tolist() for row, keep in zip(prompts, mask)]
    return tokenizer.batch_decode(ids, skip_special_tokens=skip_special_tokens)


# ----------------------------------------------------------------------------------------------------------------------
# the HTTP client
# ----------------------------------------------------------------------------------------------------------------------
class HttpJudge:
    """Scores batches on an OpenAI-compatible endpoint from a background event loop thread, so that the caller can
    start a batch (`submit`) and collect it later, from any thread, with no event loop of its own."""

    def __init__(self, config: "JudgeConfig", environ: Optional[dict] = None):
        self.config = config
        self.template = load_template(config.prompt_template)
        self.pattern = compile_score_pattern(config.score_pattern)
        self.url = config.base_url.rstrip("/") + CHAT_PATH
        self.headers = {"Content-Type": "application/json"}
        environ = os.environ if environ is None else environ
        if config.api_key_env:
            key = environ.get(config.api_key_env)
            if not key:
                raise ValueError(
                    f"`worker.reward.judge.api_key_env` names {config.api_key_env}, which is not set in the driver's "
                    "environment; export it (the key itself never goes into the config)."
                )
            self.headers["Authorization"] = f"Bearer {key}"
        self.watch = SilentJudgeWatch(
            f"The judge at {self.url} (model `{config.model}`)",
            [
                "worker.reward.judge.base_url (the server's OpenAI base URL, e.g. http://host:8000/v1)",
                "worker.reward.judge.model (a name the server serves)",
                "the key in the variable named by worker.reward.judge.api_key_env",
            ],
            config.timeout_s,
            went_silent="did the server go down or change?",
        )
        self._logged: set[str] = set()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="easyrl-http-judge", daemon=True)
        self._thread.start()
        self._client = self._on_loop(self._make_client()).result()

    def _on_loop(self, coroutine) -> concurrent.futures.Future:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop)

    async def _make_client(self) -> httpx.AsyncClient:
        # the per-attempt bound is asyncio.wait_for(timeout_s); httpx's own timeouts match it so that a connect that
        # never completes reads as a connection error (retried), not as a slow judge
        limits = httpx.Limits(
            max_connections=self.config.concurrency, max_keepalive_connections=self.config.concurrency
        )
        return httpx.AsyncClient(timeout=httpx.Timeout(self.config.timeout_s), limits=limits)

    def submit(self, prompts: Sequence[str], inputs: Sequence[dict]) -> concurrent.futures.Future:
        """Start judging one batch (`prompts[i]` with the reward input `inputs[i]`); the future's result is the list
        of JudgeResult, in order. Failures are logged and counted by `collect`, not raised by the future."""
        return self._on_loop(self._score_all(render_messages(self.template, prompts, inputs)))

    def collect(self, pending: concurrent.futures.Future, places: Any = None) -> list[JudgeResult]:
        """The results of a submitted batch, its failures logged (first of each kind, once per run, with its row in
        the data from ``places``); raises JudgeUnreachableError when no sample of the first batch, or of
        JUDGE_SILENT_STREAK batches in a row, got a score."""
        verdicts = pending.result()
        self._report(verdicts, places)
        self.watch.check(verdicts)
        return verdicts

    def score(self, prompts: Sequence[str], inputs: Sequence[dict]) -> list[JudgeResult]:
        return self.collect(self.submit(prompts, inputs))

    async def _score_all(self, messages: list[str]) -> list[JudgeResult]:
        in_flight = asyncio.Semaphore(self.config.concurrency)
        return list(await asyncio.gather(*(self._score_one(message, in_flight) for message in messages)))

    def _body(self, message: str) -> dict[str, Any]:
        return {
            "model": self.config.model,
            "messages": [{"role": "user", "content": message}],
            "temperature": self.config.temperature,
            "max_tokens": self.config.max_tokens,
        }

    async def _score_one(self, message: str, in_flight: asyncio.Semaphore) -> JudgeResult:
        config, body, detail = self.config, self._body(message), ""
        attempts = config.max_retries + 1
        for attempt in range(attempts):
            retry_after = None
            try:
                async with in_flight:  # the wait for a free slot is not part of timeout_s
                    response = await asyncio.wait_for(
                        self._client.post(self.url, json=body, headers=self.headers), config.timeout_s
                    )
            except httpx.ConnectTimeout as err:
                detail = f"could not connect within timeout_s={config.timeout_s:g} s ({err!r})"
            except (asyncio.TimeoutError, httpx.TimeoutException):
                return JudgeResult(0.0, JudgeFailure(TIMED_OUT, f"no reply within timeout_s={config.timeout_s:g} s"))
            except httpx.RequestError as err:  # refused, reset, unknown host, broken protocol or encoding
                detail = f"{type(err).__name__}: {err}"
            else:
                if response.status_code == 200:
                    return self._read_reply(response)
                detail = f"HTTP {response.status_code}: {response.text[:300]}"
                if response.status_code != 429 and response.status_code < 500:
                    return JudgeResult(0.0, JudgeFailure(REQUEST_FAILED, detail))  # retrying would change nothing
                retry_after = _retry_after_s(response)
            if attempt + 1 < attempts:
                # full jitter (a uniform wait up to the exponential bound) keeps many samples from retrying in step
                wait = random.uniform(0.0, config.retry_backoff_s * 2**attempt)
                await asyncio.sleep(min(MAX_RETRY_WAIT_S, max(wait, retry_after or 0.0)))
        return JudgeResult(0.0, JudgeFailure(REQUEST_FAILED, f"{detail} (after {attempts} attempts)"))

    def _read_reply(self, response: httpx.Response) -> JudgeResult:
        try:
            choice = response.json()["choices"][0]
            reply = choice["message"]["content"]
        except (ValueError, KeyError, IndexError, TypeError):
            detail = f"the reply is not a chat completion: {response.text[:300]!r}"
            return JudgeResult(0.0, JudgeFailure(UNPARSABLE, detail))
        if not isinstance(reply, str):
            return JudgeResult(0.0, JudgeFailure(UNPARSABLE, f"the reply has no text content: {choice!r:.300}"))
        return read_verdict(reply, choice.get("finish_reason") == "length", self.pattern, self.config)

    def _report(self, verdicts: list[JudgeResult], places: Any = None) -> None:
        report_failures(verdicts, self._logged, f"Judge {self.url} (model {self.config.model})", places)

    def close(self) -> None:
        if self._loop.is_closed():
            return
        self._on_loop(self._client.aclose()).result()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()


def _retry_after_s(response: httpx.Response) -> Optional[float]:
    """The Retry-After header in seconds (the seconds form; an HTTP date is ignored)."""
    try:
        return float(response.headers.get("retry-after", ""))
    except ValueError:
        return None
