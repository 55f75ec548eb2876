"""Loading a reward function from a user `.py` file (EasyR1's contract).

`worker.reward.reward_function` is `path/to/file.py:function`. Without `:function`, EasyR1 calls `main`; easyrl
calls `main` when the file defines it, else `compute_score` (the name EasyR1's own reward files use), and otherwise
stops with the list of functions the file defines. The module's `REWARD_TYPE` (default "batch", as in EasyR1) says
how the function is called:
    "batch"       fn(reward_inputs: list[dict], **kwargs) -> list[dict]   one call with the whole batch
    "sequential"  fn(reward_input: dict, **kwargs) -> dict               one call per response
Each input dict holds exactly EasyR1's keys: `response` (decoded text), `response_length` (tokens) and
`ground_truth` (the dataset's answer, as stored). Each output dict holds `overall` (a number, the reward placed on
the last response token) and optionally more named scores (`format`, `accuracy`, ...), which become metrics.
`worker.reward.reward_function_kwargs` are passed as keyword arguments; a file may define `check_kwargs(kwargs)`,
which raises ValueError for a setting it cannot use, called when the file is loaded (before Ray starts). `REWARD_NAME`
is read for the log only.

A function written for verl, one that takes `solution_str` (verl calls `compute_score(data_source=..., solution_str=...,
ground_truth=..., extra_info=...)` once per response), is called that way in a file without REWARD_TYPE: it gets the
names it declares among those four (all four with `**kwargs`), and may return a number or a dict whose `score` is the
reward; its other numeric entries become named scores and the rest (e.g. a predicted answer as text) are dropped.

A function written for TRL, one that takes `completions`, `completion_ids` or `environments` (TRL's GRPOTrainer
calls `fn(prompts=..., completions=..., completion_ids=..., **columns)` once per batch and gets a list of numbers
back), is called that way in a file without REWARD_TYPE: `completions` are the responses (as `[{"role": "assistant", "content": ...}]` where the prompt was chat
messages), `prompts` the prompts (their chat messages where the data has them, as TRL passes them; otherwise the
text the model saw), and the columns are every column of the row but the picture and video columns, the answer
(data.answer_key) also as `ground_truth`, and `data_source` and `extra_info`. A None in the returned list (TRL: the
function does not apply to that sample) scores 0, and a combined function's reward/<name> leaves that sample out of
its mean (TRL's nanmean). A parameter without a default that none of these fill stops the
run before it starts.
As TRL does, the call also passes `trainer_state` (`global_step`: training steps done, `max_steps`, `epoch`),
`log_metric(name, value)` (the value is logged as reward/<name> for the batch) and `log_extra(column, values)`
(accepted; easyrl keeps no completions table, and says so once). A function without `**kwargs` gets only the names
it declares.

An `async def` function is awaited in every convention (EasyR1's batch and sequential, verl's, TRL's), as verl's and
TRL's reward loops await theirs; a batch function may return a one-dimensional numpy array or tensor of numbers.

`path.py:f,g` names several functions of the file, combined as TRL combines its `reward_funcs` (`CombinedReward`):
the reward is the sum of their `overall` scores times `worker.reward.reward_weights`.

With a tool environment that has `get_reward` (TRL's environment_factory), the scorer adds its reward to `overall`
(weight 1, as TRL sums it with its reward functions) unless the file sets `SCORES_ENV_REWARD = True`: its function
then puts `env_reward` into `overall` itself (reward_function/env_reward.py does).

This module imports nothing heavy: the config check calls `resolve_reward_function` on the parsed file.
"""

import ast
import asyncio
import functools
import hashlib
import importlib.util
import inspect
import logging
import numbers
import os
import re
import sys
import threading
import time
import types
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...paths import FUNCTION_SEPARATOR, names_functions, shipped_files_hint
from ...utils.runtime_env import ray_job_runtime_env


EASYR1_DEFAULT_FUNCTION = "main"  # what EasyR1 calls when the spec names no function
FALLBACK_FUNCTION = "compute_score"  # what EasyR1's own reward files define
REWARD_TYPES = ("batch", "sequential")
VERL_REWARD_TYPE = "verl"  # chosen from the signature (a `solution_str` parameter), never written in a file
VERL_ARGUMENTS = ("data_source", "solution_str", "ground_truth", "extra_info")
# verl's BatchRewardManager calls compute_score(data_sources=..., solution_strs=..., ground_truths=..., extra_infos=...)
# with lists, once per batch, and takes a list of numbers or dicts back
VERL_BATCH_REWARD_TYPE = "verl_batch"  # chosen from the signature (a `solution_strs` parameter)
VERL_BATCH_ARGUMENTS = ("data_sources", "solution_strs", "ground_truths", "extra_infos")
TRL_REWARD_TYPE = "trl"  # chosen from the signature (a `completions` parameter), never written in a file
# the scorer's additions to each input for TRL's call (the training progress as {"global_step", "max_steps", "epoch"})
TRL_INPUT_KEYS = ("prompt", "completion_ids", "conversational", "row_columns", "trainer_state")
# what TRL's call passes besides the columns
# a parameter of one of these names makes a function TRL's (TRL's docs write functions taking any of them, e.g.
# `reward_func(completion_ids, **kwargs)` or `reward_func(environments, **kwargs)`; EasyR1's take `reward_inputs`)
TRL_SIGNATURE_NAMES = ("completions", "completion_ids", "environments")
TRL_CALL_ARGUMENTS = ("prompts", "completions", "completion_ids", "trainer_state", "log_extra", "log_metric")
TRL_SKIPPED_COLUMNS = ("prompt", "completion", *TRL_CALL_ARGUMENTS)  # columns TRL does not pass (or that would clash)
ROW_FIELD_ARGUMENTS = ("ground_truth", "data_source", "extra_info")  # easyrl's per-row fields, passed by name
DEFAULT_REWARD_TYPE = "batch"  # EasyR1's default for a file without REWARD_TYPE
CONFIG_KEY = "worker.reward.reward_function"
WEIGHTS_KEY = "worker.reward.reward_weights"
RESERVED_SCORE_NAMES = ("errors", "timeouts")  # the scorer's own counts, reward/errors and reward/timeouts


# batches in a row with nothing scored (a reward function raising on every sample, a judge giving no score) that stop
# a run which scored before: a passing fault costs a few zeros, a lasting one stops the run (scorer.py and judge.py)
FAILED_BATCH_STREAK = 3


class RewardFunctionError(ValueError):
    """A reward file, function or return value the user must fix; the message names the file and function."""


@dataclass
class RewardFunction:
    """A loaded reward function with its calling convention; call `score(inputs)` on a list of input dicts."""

    fn: Callable
    reward_type: str
    path: str
    name: str
    kwargs: dict = field(default_factory=dict)
    reward_name: str = "unknown"  # the file's REWARD_NAME, for the log
    name_was_given: bool = True  # False when `name` was chosen by the `main` / `compute_score` rule
    scores_env_reward: bool = False  # the file's SCORES_ENV_REWARD: its overall holds the environment's reward
    type_by_default: bool = False  # "batch" because neither the file nor the config said how to call it
    _log_extra_warned: bool = field(default=False, init=False, repr=False)

    @property
    def whole_batch(self) -> bool:
        """One call scores the whole batch (EasyR1's batch functions, TRL's), else one call per response."""
        return self.reward_type in ("batch", TRL_REWARD_TYPE, VERL_BATCH_REWARD_TYPE)

    @property
    def where(self) -> str:
        return f"`{self.name}` in {self.path}"

    def uses(self, reward_type: str) -> bool:
        """The function is called by ``reward_type``'s convention (the scorer gives such calls more inputs); verl's
        batch convention takes verl's inputs."""
        return self.reward_type == reward_type or (reward_type, self.reward_type) == (
            VERL_REWARD_TYPE,
            VERL_BATCH_REWARD_TYPE,
        )

    @functools.cached_property
    def verl_arguments(self) -> set[str]:
        """Which of verl's four arguments (of its batch convention's four) the function takes (read once)."""
        names = VERL_BATCH_ARGUMENTS if self.reward_type == VERL_BATCH_REWARD_TYPE else VERL_ARGUMENTS
        return _verl_arguments(self.fn, names)

    def describe(self) -> str:
        """One line for the log: which function of which file, its REWARD_NAME and REWARD_TYPE."""
        how = "" if self.name_was_given else f" (no `:function` in `{CONFIG_KEY}`; {_rule_text(self.name)})"
        kind = f"REWARD_TYPE {self.reward_type!r}"
        if self.reward_type == TRL_REWARD_TYPE:
            kind = (
                "called once per batch as TRL's GRPOTrainer calls it (it takes one of "
                + ", ".join(f"`{name}`" for name in TRL_SIGNATURE_NAMES)
                + ")"
            )
        if self.reward_type == VERL_REWARD_TYPE:
            kind = (
                f"called once per response as verl calls it (it takes `solution_str`): {sorted(self.verl_arguments)}"
            )
        if self.reward_type == VERL_BATCH_REWARD_TYPE:
            kind = (
                "called once per batch as verl's BatchRewardManager calls it (it takes `solution_strs`): "
                f"{sorted(self.verl_arguments)}"
            )
        return (
            f"Reward function {self.where}{how}; REWARD_NAME {self.reward_name!r}, {kind}, keyword arguments "
            f"{self.kwargs}."
        )

    def score(self, inputs: list[dict]) -> list[dict[str, float]]:
        """One score dict per input, checked and converted to floats. Exceptions of the function propagate."""
        return self.scored(inputs)[0]

    def scored(self, inputs: list[dict]) -> tuple[list[dict[str, float]], list[bool]]:
        """`score`'s dicts, and per input whether the function applies to it: False where a function written for
        TRL returned None (its `overall` is then 0: TRL sums the rewards without it, and logs the function's mean
        over the samples it scored)."""
        if self.reward_type == TRL_REWARD_TYPE:
            values, logged = self._call_trl(inputs)
            scores = [
                self._check({"overall": 0.0 if value is None else value, **logged}, item)
                for value, item in zip(values, inputs)
            ]
            return scores, [value is not None for value in values]
        return self._score(inputs), [True] * len(inputs)

    def _score(self, inputs: list[dict]) -> list[dict[str, float]]:
        if self.reward_type == VERL_REWARD_TYPE:
            return [self._check(self._from_verl(self._call_verl(item)), item) for item in inputs]
        if self.reward_type == VERL_BATCH_REWARD_TYPE:
            values = {
                "data_sources": [item.get("data_source") for item in inputs],
                "solution_strs": [item["response"] for item in inputs],
                "ground_truths": [item["ground_truth"] for item in inputs],
                "extra_infos": [item.get("extra_info") for item in inputs],
            }
            accepted = self.verl_arguments
            outputs = resolved(
                self.fn(**{name: value for name, value in values.items() if name in accepted}, **self.kwargs)
            )
            convention = "(verl's batch convention)"
            outputs = self._one_per_input(outputs, inputs, convention, "numbers or dicts with `score`, one per input")
            return [self._check(self._from_verl(output), item) for output, item in zip(outputs, inputs)]
        if self.reward_type == "batch":
            outputs = resolved(self.fn(inputs, **self.kwargs))
            outputs = self._one_per_input(outputs, inputs, "(REWARD_TYPE='batch')", "dicts, one per input")
        else:
            outputs = [resolved(self.fn(item, **self.kwargs)) for item in inputs]
        return [self._check(output, item) for output, item in zip(outputs, inputs)]

    def _call_verl(self, item: dict) -> Any:
        values = {
            "data_source": item.get("data_source"),
            "solution_str": item["response"],
            "ground_truth": item["ground_truth"],
            "extra_info": item.get("extra_info"),
        }
        accepted = self.verl_arguments
        return resolved(self.fn(**{name: value for name, value in values.items() if name in accepted}, **self.kwargs))

    def _call_trl(self, inputs: list[dict]) -> tuple[list, dict[str, float]]:
        """(one value per input, the metrics the function logged with `log_metric`: each name's mean)."""
        completions = [
            [{"role": "assistant", "content": item["response"]}] if item.get("conversational") else item["response"]
            for item in inputs
        ]
        standard = {"response", "response_length", *TRL_INPUT_KEYS}
        rows = [item.get("row_columns") or {} for item in inputs]
        columns = {  # the row's own columns, then easyrl's fields (the answer as ground_truth, ...) by the same name
            name: [row.get(name) for row in rows]
            for name in dict.fromkeys(name for row in rows for name in row)
            if name not in TRL_SKIPPED_COLUMNS
        }
        for name in dict.fromkeys(key for item in inputs for key in item if key not in standard):
            columns[name] = [item.get(name) for item in inputs]
        logged: dict[str, list[float]] = {}
        state = next((item["trainer_state"] for item in inputs if item.get("trainer_state")), None) or {}
        arguments = {
            **columns,
            "prompts": [item.get("prompt") for item in inputs],
            "completions": completions,
            "completion_ids": [item.get("completion_ids") for item in inputs],
            "trainer_state": types.SimpleNamespace(**{"global_step": 0, "max_steps": 0, "epoch": 0.0, **state}),
            "log_extra": self._log_extra,
            "log_metric": lambda name, value: logged.setdefault(str(name), []).append(float(value)),
            **self.kwargs,
        }
        accepted = self.trl_arguments
        if accepted is not None:  # no **kwargs: only the names it declares (TRL's call would fail on the rest)
            arguments = {name: value for name, value in arguments.items() if name in accepted}
        outputs = resolved(self.fn(**arguments))
        convention = "(TRL's convention)"
        values = self._one_per_input(outputs, inputs, convention, "numbers, one per completion")
        taken = [name for name in logged if name in ("overall", *RESERVED_SCORE_NAMES)]
        if taken:
            raise RewardFunctionError(
                f"Reward function {self.where} called log_metric({taken[0]!r}, ...): reward/{taken[0]} is easyrl's own "
                "metric; log it under another name."
            )
        return values, {name: sum(seen) / len(seen) for name, seen in logged.items()}

    @functools.cached_property
    def trl_arguments(self) -> set[str] | None:
        """The argument names a function written for TRL declares; None when it takes ``**kwargs`` (it gets all)."""
        return _declared_names(self.fn)

    def _log_extra(self, column: str, values: list) -> None:
        if not self._log_extra_warned:
            self._log_extra_warned = True
            logging.getLogger(__name__).warning(
                "Reward function %s called log_extra(%r, ...): easyrl keeps no completions table, so the column is "
                "not logged (log_metric's scalars are, as reward/<name>).",
                self.where,
                column,
            )

    def check_columns(
        self, columns: Collection[str], answer_key: str, config_key: str, rollout_fields: Collection[str] = ()
    ) -> None:
        """A function written for TRL gets the data's columns by name: one that takes a parameter without a default
        that no column (nor TRL's own arguments, easyrl's row fields, what the rollout adds (``rollout_fields``:
        `messages`, `env_reward`, `environments`) or the configured kwargs) fills is refused, before the run starts,
        naming the parameter and the columns of the data named by ``config_key``."""
        given = {*TRL_CALL_ARGUMENTS, *ROW_FIELD_ARGUMENTS, *columns, answer_key, *self.kwargs, *rollout_fields}
        missing = [
            parameter.name
            for parameter in _parameters(self.fn)
            if parameter.default is parameter.empty
            and parameter.kind in (parameter.POSITIONAL_OR_KEYWORD, parameter.KEYWORD_ONLY)
            and parameter.name not in given
        ]
        if missing:
            raise RewardFunctionError(
                f"Reward function {self.where} (TRL's convention) takes "
                f"{', '.join(f'`{name}`' for name in missing)}, but `{config_key}` has no such column (its columns: "
                f"{', '.join(columns) or 'none'}; pictures and videos are not passed). Rename the column, give the "
                f"parameter a default, or set it in `worker.reward.reward_function_kwargs`."
            )

    def _one_per_input(self, outputs: Any, inputs: list[dict], convention: str, items: str) -> list:
        """The list a batch call returned, refused unless it holds one entry per input. A one-dimensional numpy array
        or tensor is a list of its numbers (TRL and verl index what the function returns)."""
        if getattr(outputs, "ndim", None) == 1 and hasattr(outputs, "tolist"):
            outputs = outputs.tolist()
        if not isinstance(outputs, (list, tuple)) or len(outputs) != len(inputs):
            got = type(outputs).__name__ + (f" of length {len(outputs)}" if hasattr(outputs, "__len__") else "")
            hint = (
                " The file sets no REWARD_TYPE, so EasyR1's default 'batch' applies: a function that takes one input "
                'dict and returns one dict needs `REWARD_TYPE = "sequential"` in the file.'
                if self.type_by_default and isinstance(outputs, dict)
                else ""
            )
            raise RewardFunctionError(
                f"Reward function {self.where} {convention} must return a list of {len(inputs)} {items}; it "
                f"returned a {got}.{hint}"
            )
        return list(outputs)

    def _from_verl(self, output: Any) -> Any:
        """verl's return value as easyrl's score dict: a number is `overall`; a dict's `score` is, and its other
        numeric entries are named scores."""
        if isinstance(output, numbers.Real):  # a bool too (verl's `acc` often is one)
            return {"overall": float(output)}
        if isinstance(output, dict) and "score" in output:
            extra = {
                str(key): float(value)
                for key, value in output.items()
                if key not in ("score", "overall") and isinstance(value, numbers.Real)
            }
            return {"overall": output["score"], **extra}
        if isinstance(output, dict):
            raise RewardFunctionError(
                f"Reward function {self.where} (verl's convention) returned a dict without `score` (keys: "
                f"{', '.join(map(str, output)) or 'none'}); return a number or a dict with `score`."
            )
        return output

    def _check(self, output: Any, item: dict | None = None) -> dict[str, float]:
        """``output`` as a score dict of floats; ``item``: its input, named in the error (its ground truth) and kept
        on it (``error.item``), so that the scorer can name the sample's data row."""
        try:
            return self._checked(output, item)
        except RewardFunctionError as error:
            error.item = item
            raise

    def _checked(self, output: Any, item: dict | None) -> dict[str, float]:
        which = f" (for the input with ground truth {short_repr(item.get('ground_truth'))})" if item else ""
        if isinstance(output, numbers.Real) and not isinstance(output, bool):
            hint = "return {'overall': score} instead of a bare number"
        elif not isinstance(output, dict):
            hint = f"it returned a {type(output).__name__}"
        elif "overall" not in output:
            hint = f"it has no `overall` key (keys: {', '.join(map(str, output)) or 'none'})"
        else:
            checked = {}
            for key, value in output.items():
                try:
                    if isinstance(value, (str, bytes)):  # float("0.5") works, float("1/2") not: text is no score
                        raise TypeError
                    checked[str(key)] = float(value)
                except (TypeError, ValueError):
                    raise RewardFunctionError(
                        f"Reward function {self.where} returned a non-numeric score `{key}`: {value!r}{which}. "
                        "Every score must be a number."
                    ) from None
            reserved = [name for name in RESERVED_SCORE_NAMES if name in checked]
            if reserved:
                raise RewardFunctionError(
                    f"Reward function {self.where} returned a score named `{reserved[0]}`, the name of easyrl's own "
                    f"count reward/{reserved[0]} (samples that failed); rename that score."
                )
            return checked
        raise RewardFunctionError(
            f"Reward function {self.where} must return a dict with at least an `overall` float per response; {hint}"
            f"{which}."
        )


class CombinedPartError(RuntimeError):
    """One function of a combination raised: says which (the traceback above it is that function's)."""


@dataclass
class CombinedReward:
    """Several functions of one file (`path.py:f,g`), as TRL combines its `reward_funcs`: `overall` is the sum of
    each function's `overall` times its weight (`worker.reward.reward_weights`); each function's own `overall` is a
    named score under the function's name (reward/<name>, TRL's rewards/<name>), and its other named scores are
    kept as `<name>/<score>`. One call scores the whole batch when any of them does; a function that raises fails
    the samples of that call, as a single function would."""

    parts: list[RewardFunction]
    weights: list[float]

    reward_type = "combined"

    @property
    def whole_batch(self) -> bool:
        return any(part.whole_batch for part in self.parts)

    @property
    def where(self) -> str:
        return f"{', '.join(f'`{part.name}`' for part in self.parts)} in {self.parts[0].path}"

    def uses(self, reward_type: str) -> bool:
        return any(part.uses(reward_type) for part in self.parts)

    @property
    def scores_env_reward(self) -> bool:
        return any(part.scores_env_reward for part in self.parts)

    def describe(self) -> str:
        weighted = " + ".join(f"{weight:g} x {part.name}" for part, weight in zip(self.parts, self.weights))
        return f"Reward functions combined as overall = {weighted}:\n" + "\n".join(
            "  " + part.describe() for part in self.parts
        )

    def check_columns(
        self, columns: Collection[str], answer_key: str, config_key: str, rollout_fields: Collection[str] = ()
    ) -> None:
        for part in self.parts:
            if part.uses(TRL_REWARD_TYPE):
                part.check_columns(columns, answer_key, config_key, rollout_fields)

    def score(self, inputs: list[dict]) -> list[dict[str, float]]:
        return self.scored(inputs)[0]

    def scored(self, inputs: list[dict]) -> tuple[list[dict[str, float]], list[bool]]:
        """The combined score dicts, and per input whether some function applies to it (TRL warns when none
        does: the sample has no reward)."""
        each, applies = [], []
        for part in self.parts:
            try:
                scores, applicable = part.scored(inputs)
                each.append(scores)
                applies.append(applicable)
            except RewardFunctionError:
                raise  # a contract broken: its message names the function already
            except Exception as error:  # the failure names the function that raised, not all of them
                raise CombinedPartError(
                    f"`{part.name}`, one of the combined functions, raised {type(error).__name__}: {error} (the "
                    f"samples of this call score 0 for all of them)"
                ) from error
        combined = []
        for index in range(len(inputs)):
            scores = {"overall": sum(weight * got[index]["overall"] for weight, got in zip(self.weights, each))}
            for part, got, applicable in zip(self.parts, each, applies):
                if applicable[index]:  # reward/<function> is its mean over the samples it applies to, as TRL's
                    scores[part.name] = got[index]["overall"]
                scores.update({f"{part.name}/{key}": value for key, value in got[index].items() if key != "overall"})
            combined.append(scores)
        return combined, [any(applicable[index] for applicable in applies) for index in range(len(inputs))]


def resolved(value: Any) -> Any:
    """``value``, or what it resolves to when it is awaitable (a user's `async def` function, run to its end on the
    process's user loop; callable from any thread but that loop's)."""
    if not inspect.isawaitable(value):
        return value
    return asyncio.run_coroutine_threadsafe(_awaited(value), user_loop()).result()


# A user's loop that has not run its heartbeat for this long is blocked by a sync call inside an `async def` (a
# `requests.get`, a `time.sleep`): the next calls get a new loop, so that one such call costs its own deadline only.
HEARTBEAT_S = 1.0
BLOCKED_AFTER_S = 10.0


class _UserLoop:
    def __init__(self) -> None:
        self.pid = os.getpid()
        self.loop = asyncio.new_event_loop()
        self.beat = time.monotonic()
        self.loop.call_soon(self._heartbeat)
        threading.Thread(target=self.loop.run_forever, name="easyrl-user-async", daemon=True).start()

    def _heartbeat(self) -> None:
        self.beat = time.monotonic()
        self.loop.call_later(HEARTBEAT_S, self._heartbeat)

    def blocked(self) -> bool:
        return time.monotonic() - self.beat > BLOCKED_AFTER_S


_USER_LOOP: _UserLoop | None = None
_USER_LOOP_LOCK = threading.Lock()


def user_loop() -> asyncio.AbstractEventLoop:
    """One event loop per process, running in a daemon thread, for every `async def` of the user's (reward functions,
    tools, environment methods). What their code opens on a loop (an HTTP client, a sandbox connection) stays usable
    at the next call, as in TRL, which runs them on one loop too; a fresh loop per call (asyncio.run) would close it.
    A forked child builds its own (the parent's thread is not there), and a loop blocked by a sync call is left to it
    (said in the log)."""
    global _USER_LOOP
    with _USER_LOOP_LOCK:
        current = _USER_LOOP
        if current is not None and current.pid == os.getpid() and current.blocked():
            logging.getLogger(__name__).warning(
                "An `async def` of yours has blocked its event loop for over %.0f s (a sync call such as "
                "requests.get or time.sleep inside it; await an async client instead): the next calls run on a new "
                "loop, and what was opened on the blocked one (clients, connections) is not reused.",
                BLOCKED_AFTER_S,
            )
            current = None
        if current is None or current.pid != os.getpid():
            current = _USER_LOOP = _UserLoop()
        return current.loop


async def _awaited(awaitable: Any) -> Any:
    return await awaitable


def parse_spec(spec: str) -> tuple[str, str | None]:
    """`path.py:fn` -> (path, fn); `path.py:f,g` -> (path, "f,g"); `path.py` -> (path, None): the function is chosen
    by `choose_function_name`."""
    if not spec:
        raise RewardFunctionError(f"`{CONFIG_KEY}` is empty; give a reward module as path/to/file.py:function.")
    path, sep, name = spec.rpartition(":")
    if sep and re.search(r"\.py:[^/\\]", path):  # `a.py:f,b.py:g`: TRL's reward_funcs from several modules
        raise RewardFunctionError(
            f"`{CONFIG_KEY}` is `{spec}`: functions to combine come from one file (`file.py:f,g`). Define or import "
            "the others in it (an import of a module beside it needs that folder on PYTHONPATH) and name them there."
        )
    if not sep or not names_functions(name):
        return spec, None
    return path, FUNCTION_SEPARATOR.join(part.strip() for part in name.split(FUNCTION_SEPARATOR))


def _rule_text(chosen: str) -> str:
    if chosen == EASYR1_DEFAULT_FUNCTION:
        return "EasyR1 calls `main`"
    return "the file defines no `main` taking inputs (EasyR1's default), so its `compute_score` is used"


def choose_function_name(
    path: str,
    requested: str | None,
    defined: Collection[str],
    functions: Collection[str],
    inputless: Collection[str] = (),
) -> str:
    """The function to call: the one named in the spec, else `main` (EasyR1), else `compute_score`.

    `defined` is every name the file binds at top level, `functions` the functions among them (listed in the error
    raised when the choice is missing), `inputless` those that take no argument: a `main()` that takes none is the
    file's self-test (`if __name__ == "__main__": main()`, common in verl's reward files), not a reward function.
    """
    if requested is not None:
        if requested in defined:
            return requested
        missing = f"defines no function `{requested}`"
    else:
        for name in (EASYR1_DEFAULT_FUNCTION, FALLBACK_FUNCTION):
            if name in defined and not (name == EASYR1_DEFAULT_FUNCTION and name in inputless):
                return name
        missing = (
            f"names no function (`path.py:function`) and the file defines neither `{EASYR1_DEFAULT_FUNCTION}` "
            f"(EasyR1's default) nor `{FALLBACK_FUNCTION}`"
        )
    listed = sorted(name for name in functions if not name.startswith("_"))
    raise RewardFunctionError(
        f"`{CONFIG_KEY}`: `{path}` {missing}. Functions found: {', '.join(listed) or 'none'}. "
        f"Name one as {path}:<function>."
    )


def _top_level_names(tree: ast.Module) -> tuple[set[str], set[str]]:
    """(every name a module binds at top level: functions, classes, assignments, imports; its functions)."""
    names: set[str] = set()
    functions: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            functions.add(node.name)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(t.id for t in targets if isinstance(t, ast.Name))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((alias.asname or alias.name).split(".")[0] for alias in node.names if alias.name != "*")
    return names, functions


def _existing_file(path_text: str, config_key: str = CONFIG_KEY) -> Path:
    path = Path(path_text).expanduser().resolve()
    if not path.is_file():
        if config_key != CONFIG_KEY:
            raise RewardFunctionError(f"`{config_key}`: file `{path_text}` does not exist.")
        raise RewardFunctionError(
            f"`{CONFIG_KEY}`: reward file `{path_text}` does not exist. Give it as path/to/file.py:function, "
            f"e.g. reward_function/math.py:compute_score; {shipped_files_hint('reward_function')}"
        )
    return path


def parse_user_file(path_text: str, config_key: str) -> tuple[Path, set[str], set[str]]:
    """(absolute path, top-level names, top-level functions) of the user file named by `config_key`, read without
    importing it (for the config check); a missing file or a syntax error raises RewardFunctionError naming the key."""
    path, tree = _parsed_user_file(path_text, config_key)
    return (path, *_top_level_names(tree))


def _parsed_user_file(path_text: str, config_key: str) -> tuple[Path, ast.Module]:
    path = _existing_file(path_text, config_key)
    try:
        return path, ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    except SyntaxError as err:
        raise RewardFunctionError(f"`{config_key}`: `{path_text}` line {err.lineno}: {err.msg}.") from None


def import_user_file(path_text: str, config_key: str):
    """Import the user `.py` file named by `config_key` (tools, environments) the way reward files are imported."""
    return _import_file(_existing_file(path_text, config_key), config_key)


def resolve_reward_function(spec: str) -> tuple[str, str]:
    """(absolute file path, function name) for `spec`, read from the file's source without importing it.

    For the config check: it applies the same rule as `load_reward_function` (see `choose_function_name`) to the
    names the file binds at top level, and raises RewardFunctionError for a missing file, a syntax error or a
    missing function.
    """
    path_text, requested = parse_spec(spec)
    path, tree = _parsed_user_file(path_text, CONFIG_KEY)
    names, functions = _top_level_names(tree)
    declared = _reward_type_in_source(tree)
    if declared is not None and declared not in REWARD_TYPES:
        raise RewardFunctionError(_reward_type_problem(path_text, declared))
    inputless = _inputless_in_source(tree)
    chosen = [choose_function_name(path_text, name, names, functions, inputless) for name in function_names(requested)]
    return str(path), FUNCTION_SEPARATOR.join(chosen)


def _reward_type_in_source(tree: ast.Module) -> object | None:
    """The value the file's last top-level ``REWARD_TYPE = <literal>`` gives, or None (no such line, or not a literal:
    that one is read when the file is imported)."""
    value = None
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "REWARD_TYPE" for t in node.targets
        ):
            value = node.value
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.target.id == "REWARD_TYPE":
            value = node.value
    return value.value if isinstance(value, ast.Constant) else None


def _reward_type_problem(path_text: str, reward_type: object) -> str:
    return (
        f"`REWARD_TYPE` in `{path_text}` is {reward_type!r}; use 'batch' (the function takes and returns lists) or "
        "'sequential' (one dict in, one dict out)."
    )


def _inputless_in_source(tree: ast.Module) -> set[str]:
    """The top-level functions of a file's source that take no argument at all."""
    return {
        node.name
        for node in tree.body
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        and not (node.args.posonlyargs or node.args.args or node.args.kwonlyargs)
        and node.args.vararg is None
        and node.args.kwarg is None
    }


def _keywords_in_source(tree: ast.Module, name: str) -> set[str] | None:
    """The names function ``name`` of the file takes by keyword, read from its source; None when any name reaches it
    (``**kwargs``) or it is no plain ``def`` (its arguments are known only once the file is imported)."""
    declared = None
    for node in tree.body:  # the last definition of the name is the one the module keeps
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
            args = node.args
            declared = None if args.kwarg is not None else {arg.arg for arg in (*args.args, *args.kwonlyargs)}
        elif (
            isinstance(node, (ast.Assign, ast.AnnAssign, ast.ClassDef))
            and name in _top_level_names(ast.Module(body=[node], type_ignores=[]))[0]
        ):
            declared = None
    return declared


def _def_in_source(tree: ast.Module, name: str) -> ast.FunctionDef | ast.AsyncFunctionDef | None:
    """The last top-level ``def`` of ``name`` in the file (the one the module keeps); None when there is none."""
    return next(
        (n for n in reversed(tree.body) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == name),
        None,
    )


def _required_in_source(tree: ast.Module, name: str) -> list[str]:
    """The arguments an EasyR1-style function ``name`` (inputs first, the rest from reward_function_kwargs) needs and
    has no default for; none for a function written for verl or TRL (their callers fill arguments by name)."""
    node = _def_in_source(tree, name)
    if node is None:
        return []
    args = node.args
    positional = [*args.posonlyargs, *args.args]
    if {arg.arg for arg in (*positional, *args.kwonlyargs)} & {"solution_str", "solution_strs", *TRL_SIGNATURE_NAMES}:
        return []
    without_default = positional[1 : len(positional) - len(args.defaults)]
    kwonly = [arg for arg, default in zip(args.kwonlyargs, args.kw_defaults) if default is None]
    return [arg.arg for arg in (*without_default, *kwonly)]


def short_repr(value: Any, limit: int = 80) -> str:
    """``repr(value)``, cut to ``limit`` characters for a message."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _passed_in_source(tree: ast.Module, name: str) -> set[str]:
    """The arguments of function ``name`` that easyrl fills itself (not from reward_function_kwargs): an EasyR1-style
    function's first (the inputs), verl's four, TRL's call arguments."""
    node = _def_in_source(tree, name)
    if node is None:
        return set()
    positional = [arg.arg for arg in (*node.args.posonlyargs, *node.args.args)]
    names = {*positional, *(arg.arg for arg in node.args.kwonlyargs)}
    if "solution_str" in names:
        return names & set(VERL_ARGUMENTS)
    if "solution_strs" in names:
        return names & set(VERL_BATCH_ARGUMENTS)
    if names & set(TRL_SIGNATURE_NAMES):
        return names & set(TRL_CALL_ARGUMENTS)
    return set(positional[:1])


# what a value read from YAML or the command line may be for an argument annotated (or defaulted) with these names;
# other annotations (a class of the file, Literal, Any) are not checked
_ANNOTATED_TYPES = {
    "str": (str,),
    "int": (int,),
    "float": (int, float),
    "bool": (bool,),
    "list": (list, tuple),
    "List": (list, tuple),
    "tuple": (list, tuple),
    "Tuple": (list, tuple),
    "Sequence": (list, tuple),
    "dict": (dict,),
    "Dict": (dict,),
    "Mapping": (dict,),
}


def _annotation_types(node: ast.expr | None) -> tuple[type, ...] | None:
    """The Python types an annotation allows, for the plain ones (``str``, ``float | None``, ``Optional[int]``,
    ``list[str]``); None when it is not one of those."""
    if isinstance(node, ast.Constant) and node.value is None:
        return (type(None),)
    name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else None
    if name is not None:
        return _ANNOTATED_TYPES.get(name)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        left, right = _annotation_types(node.left), _annotation_types(node.right)
        return left + right if left and right else None
    if isinstance(node, ast.Subscript):
        outer = _annotation_types(node.value)
        base = node.value.id if isinstance(node.value, ast.Name) else getattr(node.value, "attr", None)
        members = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
        if base in ("Optional", "Union"):
            inner = [_annotation_types(member) for member in members]
            if not all(inner):
                return None
            return sum(inner, ()) + ((type(None),) if base == "Optional" else ())
        return outer
    return None


def _argument_types_in_source(tree: ast.Module, name: str) -> dict[str, tuple[tuple[type, ...], str]]:
    """Per argument of function ``name`` (by keyword): the types its annotation allows, else its default's (a str,
    number or bool default), with the source text that says so, for the arguments whose types are plain."""
    node = _def_in_source(tree, name)
    if node is None:
        return {}
    args = node.args
    positional = [*args.posonlyargs, *args.args]
    defaults = dict(zip([arg.arg for arg in positional[len(positional) - len(args.defaults) :]], args.defaults))
    defaults.update({arg.arg: default for arg, default in zip(args.kwonlyargs, args.kw_defaults) if default})
    found = {}
    for arg in (*positional, *args.kwonlyargs):
        default = defaults.get(arg.arg)
        text = arg.arg + (f": {ast.unparse(arg.annotation)}" if arg.annotation is not None else "")
        text += f" = {ast.unparse(default)}" if default is not None else ""
        types = _annotation_types(arg.annotation) if arg.annotation is not None else None
        if arg.annotation is None and isinstance(default, ast.Constant) and default.value is not None:
            kind = type(default.value)
            # a number default takes either kind of number: `weight=0` does not say the argument is a count
            types = (int, float) if kind in (int, float) else (kind,) if kind in (str, bool) else None
        if types:
            found[arg.arg] = (types, text)
    return found


def _wrong_type(value: Any, types: tuple[type, ...]) -> bool:
    if isinstance(value, bool):  # a bool is an int to Python, not to a reader of `threshold: int`
        return bool not in types
    return not isinstance(value, types)


def _type_hint(value: Any, types: tuple[type, ...]) -> str:
    """How the value was probably meant to be written."""
    if isinstance(value, bool) and str in types:
        return (
            " YAML reads yes/no/on/off/true/false unquoted as booleans: quote the text (on the command line"
            " '...key=\"yes\"', in a file key: 'yes')."
        )
    if isinstance(value, str) and (list in types or tuple in types):
        return f" Give a list: [{value}]."
    if isinstance(value, str) and float in types:
        try:
            float(value)
        except ValueError:
            return ""
        return " YAML 1.1 reads an exponent without a dot (1e-3) as text: write 1.0e-3."
    return ""


def check_reward_kwargs(spec: str, kwargs: dict | None) -> None:
    """For the config check: every key of `worker.reward.reward_function_kwargs` is an argument some chosen function
    of ``spec`` takes, of the plain type its annotation (or default) names, and every argument a function needs
    without a default is among them, read from the file's source without importing it (what loading the function
    checks again)."""
    kwargs = kwargs or {}
    path_text, requested = parse_spec(spec)
    path, tree = _parsed_user_file(path_text, CONFIG_KEY)
    names, functions = _top_level_names(tree)
    inputless = _inputless_in_source(tree)
    chosen = [choose_function_name(path_text, name, names, functions, inputless) for name in function_names(requested)]
    declared = [_keywords_in_source(tree, name) for name in chosen]
    accepted = set().union(*(names for names in declared if names is not None))
    unknown = sorted(str(key) for key in kwargs if key not in accepted)
    if unknown and all(names is not None for names in declared):
        colon = [key for key in unknown if ":" in key]
        hint = (
            f" `{colon[0]}` holds a colon: in YAML a mapping needs a space after it ({{format_weight: 0.2}}, not "
            "{format_weight:0.2})."
            if colon
            else ""
        )
        passed = set().union(*(_passed_in_source(tree, name) for name in chosen))
        settable = sorted(accepted - passed)
        raise RewardFunctionError(
            f"`worker.reward.reward_function_kwargs` {unknown}: {' nor '.join(f'`{name}`' for name in chosen)} in "
            f"`{path_text}` takes no such argument (it takes {', '.join(settable) or 'none'}"
            + (f"; easyrl passes {', '.join(sorted(passed & accepted))} itself" if passed & accepted else "")
            + f").{hint}"
        )
    for name in chosen:
        for key, (allowed, text) in _argument_types_in_source(tree, name).items():
            if key in kwargs and _wrong_type(kwargs[key], allowed):
                value = kwargs[key]
                raise RewardFunctionError(
                    f"`worker.reward.reward_function_kwargs.{key}` is {short_repr(value)} (a {type(value).__name__}), "
                    f"but `{name}` in `{path_text}` takes `{text}`.{_type_hint(value, allowed)}"
                )
        missing = [arg for arg in _required_in_source(tree, name) if arg not in kwargs]
        per_sample = [arg for arg in missing if arg in ROW_FIELD_ARGUMENTS]
        if per_sample:
            # `def compute_score(response, ground_truth)`: the answer differs per sample, no kwargs value can give it
            raise RewardFunctionError(
                f"`{name}` in `{path_text}` takes {', '.join(f'`{arg}`' for arg in per_sample)} as an argument after "
                "its first, which easyrl fills from worker.reward.reward_function_kwargs, one value for every sample. "
                "A sample's fields come in its first argument: write `def "
                f"{name}(reward_input)` and read reward_input['response'], reward_input['ground_truth'] (with "
                "REWARD_TYPE = 'sequential'; a list of them for 'batch'), or verl's `def "
                f"{name}(data_source, solution_str, ground_truth, extra_info=None)`."
            )
        if missing:
            given = " ".join(f"worker.reward.reward_function_kwargs.{arg}=..." for arg in missing)
            raise RewardFunctionError(
                f"`{name}` in `{path_text}` needs {', '.join(f'`{arg}`' for arg in missing)}, "
                f"{'which has' if len(missing) == 1 else 'which have'} no default: "
                f"give it in worker.reward.reward_function_kwargs ({given})."
            )


def _import_file(path: Path, config_key: str = CONFIG_KEY):
    # a unique module name: the shipped `math.py` must not shadow the standard library's `math` in sys.modules
    digest = hashlib.sha1(str(path).encode()).hexdigest()[:10]
    module_name = f"easyrl_reward_{path.stem}_{digest}"
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise RewardFunctionError(f"`{config_key}`: cannot import `{path}` as a Python module.")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except SystemExit as err:  # a script turned into a user file: argparse or sys.exit at its top level
        sys.modules.pop(module_name, None)
        argparse = (
            " (argparse exits so when easyrl's command line is not the script's: the usage line above is the file's,"
            " not easyrl's)"
            if err.code == 2
            else ""
        )
        raise RewardFunctionError(
            f"`{config_key}`: importing `{path}` ran sys.exit({err.code!r}) at its top level{argparse}. Move the "
            'script\'s top-level code under `if __name__ == "__main__":`, so that importing the file only defines '
            "its functions."
        ) from None
    except Exception as err:
        sys.modules.pop(module_name, None)
        hint = _missing_module_hint(err, path) if isinstance(err, ModuleNotFoundError) and err.name else ""
        raise RewardFunctionError(
            f"`{config_key}`: importing `{path}` failed with {type(err).__name__}: {err}.{hint}"
        ) from err
    return module


def _missing_module_hint(err: ModuleNotFoundError, path: Path) -> str:
    """How to get the module a user file could not import. A module next to the file is not found because the file is
    imported by its path: its folder is not put on the import path (``python file.py`` would), since a file there
    named like a module (the shipped ``math.py``) would shadow that module for the whole run."""
    folder, module = path.resolve().parent, err.name.split(".")[0]
    if (folder / f"{module}.py").is_file() or (folder / module / "__init__.py").is_file():
        # a Ray job's workers get the job's runtime env, not the driver's PYTHONPATH (trainer/main.py)
        where = (
            "PYTHONPATH in the env_vars of the job's runtime env, or the folder in its py_modules"
            if ray_job_runtime_env() is not None
            else f"PYTHONPATH={folder}: the run gives the workers its PYTHONPATH"
        )
        return (
            f" `{module}` is next to it in `{folder}`, but easyrl imports the file by its path, so that folder is not "
            f"on the import path. Put it there ({where}), or make the helpers an installed package (pip install -e)."
        )
    # e.g. mathruler's grader needs pylatexenc, which mathruler does not declare
    return f" Install the missing package into this environment (`pip install {module}`)."


def load_reward_function(
    spec: str, kwargs: dict | None = None, weights: list[float] | None = None, reward_type: str | None = None
) -> "RewardFunction | CombinedReward":
    """Import `path.py[:fn]`, choose the function, read REWARD_TYPE, and check that it accepts `kwargs`.
    ``reward_type``: worker.reward.reward_type, how a file without REWARD_TYPE is called (older EasyR1 configs).

    `path.py:f,g` names several functions of the file (TRL's `reward_funcs`): they are combined with `weights`
    (TRL's `reward_weights`; default 1 each) into a `CombinedReward`, each getting the `kwargs` it accepts."""
    path_text, requested = parse_spec(spec)
    path = _existing_file(path_text)
    module = _import_file(path)
    names = function_names(requested)
    if weights is not None and len(weights) != len(names):
        raise RewardFunctionError(
            f"`{WEIGHTS_KEY}` has {len(weights)} weight(s) for {len(names)} reward function(s) in `{CONFIG_KEY}`; "
            "give one weight per function, in the same order."
        )
    kwargs = dict(kwargs or {})
    if len(names) == 1 and (weights is None or float(weights[0]) == 1.0):
        return _load_one(module, path, path_text, names[0], kwargs, reward_type)
    if len(set(names)) != len(names):
        raise RewardFunctionError(f"`{CONFIG_KEY}` names a function twice: {spec}.")
    taken = [name for name in names if name in ("overall", *RESERVED_SCORE_NAMES)]
    if taken:  # each function's score is logged under its name
        raise RewardFunctionError(
            f"`{CONFIG_KEY}`: a combined function may not be called `{taken[0]}` (its score would be logged as "
            f"reward/{taken[0]}, a name easyrl uses); rename it."
        )
    parts = []
    for name in names:
        fn = getattr(module, name, None)
        accepted = _declared_names(fn) if callable(fn) else None
        part_kwargs = kwargs if accepted is None else {k: v for k, v in kwargs.items() if k in accepted}
        parts.append(_load_one(module, path, path_text, name, part_kwargs, reward_type))
    unused = [key for key in kwargs if not any(key in part.kwargs for part in parts)]
    if unused:
        raise RewardFunctionError(
            f"`worker.reward.reward_function_kwargs` {sorted(unused)}: none of the functions of `{CONFIG_KEY}` "
            f"({', '.join(names)}) takes them."
        )
    return CombinedReward(parts, [1.0] * len(parts) if weights is None else [float(w) for w in weights])


def function_names(requested: str | None) -> list[str | None]:
    """The function names of a spec's `:f,g` part ([None]: the file's `main` / `compute_score` rule chooses)."""
    return requested.split(FUNCTION_SEPARATOR) if requested else [None]


def _load_one(
    module: Any, path: Path, path_text: str, requested: str | None, kwargs: dict, configured_type: str | None = None
) -> RewardFunction:
    functions = {name for name, obj in vars(module).items() if inspect.isfunction(obj)}
    inputless = {name for name in functions if not _parameters(getattr(module, name))}
    name = choose_function_name(path_text, requested, set(vars(module)), functions, inputless)
    fn = getattr(module, name)
    if not callable(fn):
        raise RewardFunctionError(f"`{CONFIG_KEY}`: `{name}` in `{path_text}` is not a function.")
    if configured_type is not None and getattr(module, "REWARD_TYPE", configured_type) != configured_type:
        _warn_once(  # a verl or TRL signature is recognised whatever the key says, below
            f"worker.reward.reward_type is {configured_type!r} but `{path_text}` says REWARD_TYPE = "
            f"{module.REWARD_TYPE!r}: the file's convention is used (its function is written for it)."
        )
    if not hasattr(module, "REWARD_TYPE") and "solution_str" in _parameter_names(fn):
        reward_type = VERL_REWARD_TYPE
        _check_binding(fn, kwargs, dict.fromkeys(_verl_arguments(fn)), name, path_text)
    elif not hasattr(module, "REWARD_TYPE") and "solution_strs" in _parameter_names(fn):
        reward_type = VERL_BATCH_REWARD_TYPE
        _check_binding(fn, kwargs, dict.fromkeys(_verl_arguments(fn, VERL_BATCH_ARGUMENTS)), name, path_text)
    elif not hasattr(module, "REWARD_TYPE") and _parameter_names(fn) & set(TRL_SIGNATURE_NAMES):
        reward_type = TRL_REWARD_TYPE  # TRL's own call passes columns the function may not name: no binding check
    else:
        reward_type = getattr(module, "REWARD_TYPE", configured_type or DEFAULT_REWARD_TYPE)
        if reward_type not in REWARD_TYPES:
            raise RewardFunctionError(_reward_type_problem(path_text, reward_type))
        _check_binding(fn, kwargs, None, name, path_text)
    _check_file_kwargs(module, path_text, kwargs)
    return RewardFunction(
        fn=fn,
        reward_type=reward_type,
        path=str(path),
        name=name,
        kwargs=kwargs,
        reward_name=str(getattr(module, "REWARD_NAME", "unknown")),
        name_was_given=requested is not None,
        scores_env_reward=bool(getattr(module, "SCORES_ENV_REWARD", False)),
        type_by_default=not hasattr(module, "REWARD_TYPE") and configured_type is None,
    )


def _check_file_kwargs(module: Any, path_text: str, kwargs: dict) -> None:
    """A reward file may define ``check_kwargs(kwargs)``, raising ValueError for a setting it cannot use: called
    when the run loads the file (before Ray starts), not at the first batch."""
    check = getattr(module, "check_kwargs", None)
    if not callable(check):
        return
    try:
        check(dict(kwargs))
    except ValueError as err:
        raise RewardFunctionError(f"`worker.reward.reward_function_kwargs` for `{path_text}`: {err}") from None


_WARNED: set[str] = set()


def _warn_once(message: str) -> None:
    if message not in _WARNED:
        _WARNED.add(message)
        logging.getLogger(__name__).warning(message)


def _check_binding(fn: Callable, kwargs: dict, verl_arguments: dict | None, name: str, path_text: str) -> None:
    """The function accepts one input (or, written for verl, its arguments by name) and the configured kwargs."""
    try:
        if verl_arguments is None:
            inspect.signature(fn).bind(None, **kwargs)
        else:
            inspect.signature(fn).bind(**verl_arguments, **kwargs)
    except TypeError as err:
        batch = any(name in VERL_BATCH_ARGUMENTS for name in verl_arguments or ())
        called = (
            "one input"
            if verl_arguments is None
            else f"verl's arguments by name ({', '.join(VERL_BATCH_ARGUMENTS if batch else VERL_ARGUMENTS)}: it "
            f"takes `{'solution_strs' if batch else 'solution_str'}`)"
        )
        raise RewardFunctionError(
            f"Reward function `{name}` in `{path_text}` cannot be called with {called} and the keyword arguments "
            f"{sorted(kwargs)} from `worker.reward.reward_function_kwargs`: {err}."
        ) from None
    except ValueError:
        pass  # builtins without a signature: trust them


def _parameters(fn: Callable) -> list[inspect.Parameter]:
    """The function's parameters; none known for a builtin without a signature."""
    try:
        return list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return []


def _parameter_names(fn: Callable) -> set[str]:
    return {parameter.name for parameter in _parameters(fn)}


def _declared_names(fn: Callable) -> set[str] | None:
    """The argument names ``fn`` declares; None when any name reaches it (it takes ``**kwargs``, or has no known
    signature)."""
    parameters = _parameters(fn)
    if not parameters or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        return None
    return {p.name for p in parameters}


def _verl_arguments(fn: Callable, names: tuple[str, ...] = VERL_ARGUMENTS) -> set[str]:
    """Which of verl's four argument ``names`` ``fn`` takes (all four when it takes ``**kwargs``)."""
    declared = _declared_names(fn)
    return set(names) if declared is None else declared & set(names)
