"""`easyrl generate` (and the sampling of `easyrl eval`): n responses per prompt of ``data.val_files`` from the
rollout engine, scored by the configured reward, written to a jsonl file one batch at a time.

Only what generation needs runs: the worker group of ``plan.generation_worker_role`` (the vLLM engine loads the
model itself; no optimizer, reference or critic) and the reward scorer. One row per prompt::

    {"index": 3, "data_source": "...", "prompt": "<templated prompt text>", "ground_truth": "...",
     "responses": ["...", ...], "scores": [{"overall": 1.0, "accuracy": 1.0, ...}, ...]}

A score that does not apply to a sample (a TRL reward function's None) is ``null`` in its ``scores``; ``overall``
counts it as 0, as the trainer does.

With a tool environment (``worker.rollout.multi_turn.env``) whose ``reset`` adds text to the prompt, the row also
holds ``"sample_prompts"``: the prompt each sample was generated from (``prompt`` stays the dataset's, which a
resumed run checks). A multi-turn row holds each sample's turns (``"messages"``) and counts (``"multi_turn"``: turns,
tool calls, errors, timeouts), which ``multi_turn_totals`` sums for the summaries.

``index`` is the prompt's position among the prompts of the validation data that are kept (stable for the same data
and data.* keys); ``row`` is its row in ``data.val_files`` (numbered from 0, as the warnings about skipped rows
number them), which differs from ``index`` once rows are skipped or dropped. ``settings`` are what made the
responses (the model, the sampling, the seed and the reward): a run continues a file only when they are its own, so
that a file never mixes models or sampling, and a file of an earlier model is never reported as this one's. Each batch's
rows are appended in one write, flushed and fsynced before the next batch starts: a run killed at any moment leaves
whole rows plus at most one partial last line. A run with an existing output drops that partial line (with a
warning), keeps every whole row, and generates only the prompts that have none: no row twice. Each batch samples
with a seed of (worker.rollout.seed, batch index) only, so a resumed batch draws what the uninterrupted run drew.
"""

import dataclasses
import json
import logging
import math
import os
import signal
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..config import RunPlan
from ..protocol import DataProto
from ..utils.logging import setup_driver_logging
from ..workers.reward.scorer import failed_samples, named_scores
from ..workers.rollout.base import GenerationRequest, resolve_sampling
from ..workers.tool_files import MULTI_TURN_COUNTS, has_tool_env
from .checkpoint import input_file_digests, local_model_folder, model_weights_fingerprint
from .ray_trainer import GENERATION_KEYS, generation_non_tensor_keys, join_rollout_output


logger = logging.getLogger(__name__)

FAILED_KEY = "scoring_failed"
"""In a sample's scores: true where the reward function failed on it (it raised, gave a non-finite score, timed out
or its actor died) or its judge gave no grade, so its 0 (or its judge's 0) is no answer's score."""

GENERATE_FILE = "samples.jsonl"
"""`easyrl generate`'s output under trainer.save_checkpoint_path when generate.output is not set."""

# the kind number of the sampling seed (rollout.seed, kind, batch): the trainer uses 0 (training) and 1 (validation)
GENERATE_SEED_KIND, EVAL_SEED_KIND = 2, 3


class GenerationFileError(ValueError):
    """An existing output file that cannot be continued (the message names the file, the row and the fix)."""


# ----------------------------------------------------------------------------------------------------------------------
# the output file
# ----------------------------------------------------------------------------------------------------------------------
def read_rows(path: str, repair: bool = False) -> list[dict[str, Any]]:
    """The whole rows of a generation file (none when it does not exist). A last line without its newline is what a
    killed write leaves: with ``repair`` it is cut off the file (a warning says so), else it is skipped with a warning.
    Any other line that is not a JSON object is an error naming the line."""
    if not os.path.exists(path):
        return []
    with open(path, "rb") as handle:
        data = handle.read()
    whole_end = data.rfind(b"\n") + 1  # bytes up to the end of the last whole line
    if whole_end < len(data):
        logger.warning(
            "%s: the last line (%d bytes) is incomplete, the trace of a run that was stopped while writing: %s.",
            path,
            len(data) - whole_end,
            "dropped, its prompts are generated again" if repair else "skipped",
        )
        if repair:
            os.truncate(path, whole_end)
    rows = []
    for number, line in enumerate(data[:whole_end].decode("utf-8").splitlines(), start=1):
        try:
            row = json.loads(line)
        except json.JSONDecodeError as error:
            raise GenerationFileError(
                f"{path}: line {number} is not JSON ({error}); the file was not written by `easyrl generate`. "
                "Delete it or choose another output file."
            ) from None
        if not isinstance(row, dict) or "index" not in row or "responses" not in row:
            raise GenerationFileError(
                f"{path}: line {number} is not a generation row (an object with `index` and `responses`); "
                "delete the file or choose another output file."
            )
        rows.append(row)
    return rows


def _rows_data(rows: list[dict[str, Any]]) -> bytes:
    return "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows).encode("utf-8")


def drop_unscored_rows(path: str) -> int:
    """Remove from ``path`` (atomically) the rows holding a sample marked ``FAILED_KEY`` (the reward function failed
    on it or its judge gave no grade, often a judge that was down or rate-limited): a rerun generates and scores them
    again. How many rows went."""
    rows = read_rows(path, repair=True)
    kept = [row for row in rows if not any(score.get(FAILED_KEY) for score in row.get("scores") or [])]
    if len(kept) < len(rows):
        from ..utils.files import replace_file

        replace_file(path, _rows_data(kept))
    return len(rows) - len(kept)


def append_rows(path: str, rows: list[dict[str, Any]]) -> None:
    """Append ``rows`` as jsonl in one write, flushed and fsynced: after a kill the file holds whole batches plus at
    most one partial line, which ``read_rows`` detects."""
    data = _rows_data(rows)
    with open(path, "ab") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())


# ----------------------------------------------------------------------------------------------------------------------
# generation
# ----------------------------------------------------------------------------------------------------------------------
@dataclass
class GenerationSummary:
    """What one `easyrl generate` run did."""

    path: str
    prompts: int
    """Prompts of the validation data."""
    generated: int
    """Prompts generated by this run."""
    resumed: int
    """Prompts whose rows an earlier run had written."""


def _decode_responses(tokenizer: Any, batch: DataProto) -> list[str]:
    # the attended response: a multi-turn rollout's tool results are in it (response_mask has only the model's)
    responses = batch.batch["responses"]
    mask = batch.batch["attention_mask"][:, -responses.shape[-1] :].bool()
    return [tokenizer.decode(responses[i][mask[i]], skip_special_tokens=True) for i in range(len(batch))]


def generation_settings(plan: RunPlan, request: GenerationRequest) -> dict[str, Any]:
    """What makes a file's responses and scores: the model, the sampling ``request`` resolves to, the seed (and with
    sampling, the batches it is drawn per), the multi-turn settings (tools, environment, turns) and the reward (as
    stored in each row, in JSON's types)."""
    config = plan.config
    sampling = resolve_sampling(config.worker.rollout, request)
    model = config.worker.actor.model.model_path
    if model and os.path.exists(os.path.expanduser(model)):
        model = os.path.abspath(os.path.expanduser(model))
    reward = config.worker.reward
    settings = {
        "model_path": model,
        # the weights themselves: a folder is often rewritten in place (a resumed `easyrl sft`, a merge run again)
        "model_weights": model_weights_fingerprint(config.worker.actor.model.model_path),
        "sampling": {**dataclasses.asdict(sampling), "val_sampling": request.validate},
        "seed": config.worker.rollout.seed,
        "reward_function": reward.reward_function or None,
    }
    if sampling.temperature > 0:
        # each batch samples with a seed of its index: other batches draw other samples for the same prompts
        settings["val_batch_size"] = config.data.val_batch_size
    if _reads_pictures(config.worker.actor.model.model_path):
        # what the model sees of each picture and video: the compared prompt holds one placeholder token per
        # picture or video, whatever its size or frames
        settings["media"] = {key: getattr(config.data, key) for key in MEDIA_KEYS}
    multi_turn = config.worker.rollout.multi_turn
    if multi_turn.enabled:  # tools, an environment, the turn limits: each changes what a response is
        settings["multi_turn"] = dataclasses.asdict(multi_turn)
    digests = input_file_digests(config)
    # the code of the tools, the environment and the judge's template (the keys above hold only their paths): an
    # edited tool answers the model's calls otherwise, so the earlier trajectories are not this run's (the prompt
    # template needs none: each row's prompt is compared)
    files = {
        key: digest
        for key, digest in digests.items()
        if key.startswith("worker.rollout.multi_turn.")
        or (key == "worker.reward.judge.prompt_template" and reward.reward_function)
    }
    if files:
        settings["input_files"] = files
    if reward.reward_function:
        # its code, with the modules of the user's it imports (checkpoint.code_digest): a fixed reward function
        # must not leave the earlier scores standing
        settings["reward_file"] = digests.get("worker.reward.reward_function")
        settings["reward_function_kwargs"] = dict(reward.reward_function_kwargs or {})
        settings["reward_weights"] = list(reward.reward_weights) if reward.reward_weights else None
        if reward.judge.kind != "none":  # a judge's grade is part of each score
            settings["rule_weight"] = reward.rule_weight
            settings["judge"] = _without_transport(dataclasses.asdict(reward.judge))
    return json.loads(json.dumps(settings, default=str))


# judge settings that change how grades are fetched, never a grade (a request that fails is marked scoring_failed):
# lowered concurrency or raised timeouts after a rate-limited eval must not refuse the file it goes on with
JUDGE_TRANSPORT_KEYS = (
    "api_key_env",
    "concurrency",
    "max_retries",
    "retry_backoff_s",
    "timeout_s",
    "num_gpus",
    "gpu_memory_utilization",
    "kv_cache_memory_bytes",
)


def _without_transport(judge: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in judge.items() if key not in JUDGE_TRANSPORT_KEYS}


# the data.* keys that decide a picture's pixels and a video's frames (generation_settings' `media`)
MEDIA_KEYS = ("min_pixels", "max_pixels", "video_fps", "max_frames")


def _reads_pictures(model_path: str | None) -> bool:
    """Whether the model is a vision-language one (its config.json, local or in the hub cache, has a vision_config);
    True when it cannot be read: the media keys are then compared, which costs at most a refusal naming them."""
    from ..demo.builtin_models import resolve_model_path

    try:
        folder = local_model_folder(resolve_model_path(model_path) or "")
        with open(os.path.join(folder or "", "config.json")) as file:
            return "vision_config" in json.load(file)
    except (OSError, ValueError):
        return True


# settings that earlier versions did not write: a file without them is not refused for lacking them
LATER_SETTINGS = ("model_weights", "reward_file", "input_files", "val_batch_size", "media")


def _comparable(written: dict[str, Any], settings: dict[str, Any]) -> dict[str, Any]:
    """``settings`` less the LATER_SETTINGS that ``written`` (a row of an earlier version) does not hold."""
    return {key: value for key, value in settings.items() if key in written or key not in LATER_SETTINGS}


def _settings_changes(written: dict[str, Any], settings: dict[str, Any]) -> str:
    """ "model_path: 'a' in the file, 'b' now; ..." for each setting that differs (one level into a mapping)."""
    changes = []
    for key in sorted(set(written) | set(settings)):
        old, new = written.get(key), settings.get(key)
        if isinstance(old, dict) and isinstance(new, dict):
            section = SETTING_SECTIONS.get(key, key)  # named as the config names it, where it is a config section
            changes += [
                f"{section}.{name}: {old.get(name)!r} in the file, {new.get(name)!r} now"
                for name in sorted(set(old) | set(new))
                if old.get(name) != new.get(name)
            ]
        elif old != new:
            changes.append(f"{key}{SETTING_GLOSSES.get(key, '')}: {old!r} in the file, {new!r} now")
    return "; ".join(changes)


# the settings that copy a config section, named by it where they changed
SETTING_SECTIONS = {"media": "data", "judge": "worker.reward.judge", "multi_turn": "worker.rollout.multi_turn"}


# what a setting holding a digest is a digest of, said where it changed
SETTING_GLOSSES = {
    "reward_file": " (the reward function's file and the modules of yours it imports)",
    "model_weights": " (the weight files in worker.actor.model.model_path)",
}


def _check_resumed_row(
    path: str,
    row: dict[str, Any],
    prompt: str,
    samples: int,
    settings: dict[str, Any] | None,
    ground_truth: Any = None,
    output_key: str = "generate.output",
) -> None:
    """A row of an earlier run must be the one this run would write: same prompt and ground truth (``ground_truth``
    in JSON's types; None: not checked), same number of samples, and made with the same settings (a row without them
    comes from a version that did not write them)."""
    written = row.get("settings")
    if isinstance(written, dict) and isinstance(written.get("judge"), dict):  # earlier versions wrote every key
        written = {**written, "judge": _without_transport(written["judge"])}
    settings = None if settings is None or written is None else _comparable(written, settings)
    if settings is not None and written != settings:
        raise GenerationFileError(
            f"{path}: its rows were made with other settings ({_settings_changes(written, settings)}): continuing it "
            "would mix the two, or report the earlier settings' results as these. Choose another output file "
            f"({output_key}, or another trainer.save_checkpoint_path) or delete it."
        )
    if row.get("prompt") != prompt:
        raise GenerationFileError(
            f"{path}: the row of prompt index {row['index']} holds another prompt than data.val_files has at that "
            "position: the file was written for other data or data.* settings. Delete it or choose another "
            f"{output_key}."
        )
    if ground_truth is not None and "ground_truth" in row and row["ground_truth"] != ground_truth:
        raise GenerationFileError(
            f"{path}: the row of prompt index {row['index']} holds the answer {str(row['ground_truth'])[:80]!r}, "
            f"data.val_files now {str(ground_truth)[:80]!r} (data.answer_key): its scores were computed against the "
            f"earlier answer. Delete the file or choose another {output_key}."
        )
    if len(row["responses"]) != samples:
        raise GenerationFileError(
            f"{path}: the row of prompt index {row['index']} has {len(row['responses'])} responses, this run samples "
            f"{samples} per prompt: the file was written with another worker.rollout.n / eval.k. Delete it or choose "
            f"another {output_key}."
        )


def prompts_left(
    path: str,
    tokenizer: Any,
    val_loader: Any,
    samples_per_prompt: int,
    settings: dict[str, Any] | None = None,
    output_key: str = "generate.output",
) -> int | None:
    """How many prompts of ``val_loader`` the file at ``path`` has no row for (None: no file yet, so all of them),
    its rows checked against this run's prompts, samples and ``settings`` (``generation_settings``; None: not
    checked): before Ray and the engine start, so that a file written for other settings is refused, and a finished
    one finished, at once."""
    done = {int(row["index"]): row for row in read_rows(path, repair=True)}
    if not done:
        return None
    if settings is not None and any("settings" not in row for row in done.values()):
        logger.warning(
            "%s: rows without the settings that made them (an older version wrote them): whether they come from this "
            "model and sampling cannot be checked.",
            path,
        )
    position, left = 0, 0
    for prompts in _batches(val_loader):
        truths = prompts.non_tensor_batch.get("ground_truth")
        for k, ids in enumerate(prompts.non_tensor_batch["raw_prompt_ids"]):
            if position in done:
                # as the file holds it: through JSON and back
                truth = None if truths is None else json.loads(json.dumps(_jsonable(truths[k])))
                _check_resumed_row(
                    path, done[position], tokenizer.decode(ids), samples_per_prompt, settings, truth, output_key
                )
            else:
                left += 1
            position += 1
    return left


def generate_to_file(
    plan: RunPlan,
    tokenizer: Any,
    val_loader: Any,
    rollout: Any,
    reward: Any,
    path: str,
    request_for_batch: Callable[[int], GenerationRequest],
    samples_per_prompt: int,
    settings: dict[str, Any] | None = None,
) -> GenerationSummary:
    """Generate (and score, when ``reward`` is given) every prompt of ``val_loader`` that ``path`` has no row for;
    append each batch's rows to ``path``. ``rollout``: the worker group hosting the engine. The rows already in
    ``path`` were checked against this run's prompts and samples by ``prompts_left`` (``GenerationRun`` calls it
    before the engine starts). ``settings`` (``generation_settings``) go into every row."""
    done = {int(row["index"]): row for row in read_rows(path, repair=True)}
    # position -> row of data.val_files (None: batches handed in without a dataset)
    row_numbers = getattr(getattr(val_loader, "dataset", None), "row_index", None)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    position, generated, errors = 0, 0, 0
    resets_grow = has_tool_env(plan.config.worker.rollout.multi_turn.env)
    for batch_index, prompts in enumerate(_batches(val_loader)):
        indices = list(range(position, position + len(prompts)))
        position += len(prompts)
        texts = [tokenizer.decode(ids) for ids in prompts.non_tensor_batch["raw_prompt_ids"]]
        todo = [i for i, index in enumerate(indices) if index not in done]
        if not todo:
            continue
        # the whole batch, even when a kill left some of its rows: the seeds are drawn per batch, so its missing rows
        # get the samples the uninterrupted run gave them
        gen_input = prompts.select(
            batch_keys=list(GENERATION_KEYS),
            non_tensor_batch_keys=generation_non_tensor_keys(prompts, plan.config.worker.rollout.multi_turn),
        )
        generated_batch = rollout.generate_sequences(gen_input, request_for_batch(batch_index))
        generated_batch.meta_info.pop("metrics", None)
        repeat = len(generated_batch) // len(prompts)
        if repeat != samples_per_prompt:
            raise RuntimeError(f"The engine returned {repeat} samples per prompt, {samples_per_prompt} expected.")
        batch = join_rollout_output(prompts.repeat(repeat, interleave=True), generated_batch)  # samples adjacent
        responses = _decode_responses(tokenizer, batch)
        # the prompts the samples were generated from: a tool environment's reset may have grown them
        seen = [tokenizer.decode(ids) for ids in batch.non_tensor_batch["raw_prompt_ids"]] if resets_grow else None
        turns = batch.non_tensor_batch.get("messages")
        counts = batch.non_tensor_batch.get(MULTI_TURN_COUNTS)
        scores: list[dict[str, float]] | None = None
        if reward is not None:
            token_scores, reward_metrics = reward.score(batch)
            scores = sample_scores(token_scores, reward_metrics)
            errors += sum(bool(score.get(FAILED_KEY)) for score in scores)
        sources = batch.non_tensor_batch.get("data_source", np.array(["val"] * len(batch), dtype=object))
        rows = []
        for i in todo:
            samples = slice(i * repeat, (i + 1) * repeat)
            row = {
                "index": indices[i],
                "row": indices[i] if row_numbers is None else int(row_numbers[indices[i]]),
                "data_source": str(sources[i * repeat]),
                "prompt": texts[i],
                "ground_truth": _jsonable(batch.non_tensor_batch["ground_truth"][i * repeat]),
                "responses": responses[samples],
            }
            if seen is not None and any(text != texts[i] for text in seen[samples]):
                row["sample_prompts"] = seen[samples]
            if turns is not None:  # a multi-turn rollout: each sample's turns, which text is the model's or a tool's
                row["messages"] = [list(messages) for messages in turns[samples]]
            if counts is not None:  # each sample's turns, tool calls and their errors (multi_turn_totals sums them)
                row["multi_turn"] = [dict(sample) for sample in counts[samples]]
            if scores is not None:
                row["scores"] = scores[samples]
            if settings is not None:
                row["settings"] = settings
            rows.append(row)
        append_rows(path, rows)
        generated += len(rows)
        logger.info("batch %d: %d prompts x %d samples written to %s", batch_index, len(rows), repeat, path)
    if errors:
        logger.warning(
            "%d samples could not be fully scored (the reward function failed, or the judge gave no grade): the part "
            "that failed counts 0 in their `overall` (with a judge, the other part is kept), marked `%s` in the file "
            "(see the log for why).",
            errors,
            FAILED_KEY,
        )
    return GenerationSummary(path=path, prompts=position, generated=generated, resumed=position - generated)


def multi_turn_totals(rows: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Per data source, the multi-turn counts of its rows' samples (``row["multi_turn"]``) summed, with ``turns`` as
    ``turns_mean`` and ``turns_max`` over the samples and ``prompts`` the rows counted; {} when no row has them (a
    single-turn run, or rows an older easyrl wrote)."""
    totals: dict[str, dict[str, float]] = {}
    for row in rows:
        samples = row.get("multi_turn")
        if not samples:
            continue
        entry = totals.setdefault(str(row["data_source"]), {"prompts": 0, "samples": 0, "turns": 0, "turns_max": 0})
        entry["prompts"] += 1
        for sample in samples:
            entry["samples"] += 1
            entry["turns_max"] = max(entry["turns_max"], sample.get("turns", 0))
            for name, value in sample.items():
                entry[name] = entry.get(name, 0) + value
    for entry in totals.values():
        entry["turns_mean"] = entry.pop("turns") / max(entry["samples"], 1)
    return dict(sorted(totals.items()))


def all_sources(totals: dict[str, dict[str, float]]) -> dict[str, float]:
    """``multi_turn_totals`` over every source: counts added, ``turns_mean`` weighted by samples, the largest max."""
    joined: dict[str, float] = {}
    for entry in totals.values():
        for name, value in entry.items():
            if name == "turns_max":
                joined[name] = max(joined.get(name, 0), value)
            elif name == "turns_mean":
                joined[name] = joined.get(name, 0.0) + value * entry["samples"]
            else:
                joined[name] = joined.get(name, 0) + value
    if joined:
        joined["turns_mean"] /= max(joined["samples"], 1)
    return joined


def describe_multi_turn(totals: dict[str, dict[str, float]]) -> str:
    """One line of what the tools and environments did over all sources (empty without counts)."""
    every = all_sources(totals)
    if not every:
        return ""
    parts = []
    if "tool_calls" in every:
        calls, errors, late = int(every["tool_calls"]), int(every["tool_errors"]), int(every["tool_timeouts"])
        part = f"{calls} tool calls, {errors} answered with an error ({late} of them timed out)"
        if every.get("tool_args_coerced"):
            part += f", {int(every['tool_args_coerced'])} arguments read as their schema's type"
        parts.append(part)
    if "env_errors" in every:
        parts.append(f"{int(every['env_errors'])} environment errors ({int(every['env_timeouts'])} of them timed out)")
    parts.append(f"turns {every['turns_mean']:.2f} mean, {int(every['turns_max'])} max")
    parts.append(
        f"{int(every['truncated'])} of {int(every['samples'])} samples cut at data.max_response_length, "
        f"{int(every['max_turns_reached'])} stopped at worker.rollout.multi_turn.max_turns"
    )
    return f"multi-turn over {int(every['prompts'])} prompts: " + "; ".join(parts)


def warn_failing_tools(totals: dict[str, dict[str, float]], path: str) -> None:
    """Most tool calls (or environments) failing makes the scores those of the model with tools that did not answer
    (a sandbox or API that is down), which the numbers alone do not show."""
    every = all_sources(totals)
    calls, errors = every.get("tool_calls", 0), every.get("tool_errors", 0)
    if calls and errors > calls / 2:
        logger.warning(
            "%d of %d tool calls answered the model with an error (%d timed out): the scores are of the model with "
            "tools that mostly did not answer. Each sample's tool messages are in %s.",
            errors,
            calls,
            every["tool_timeouts"],
            path,
        )
    if every.get("env_errors"):
        logger.warning(
            "%d environment resets or steps failed (%d timed out), each ending its trajectory; see the log and %s.",
            every["env_errors"],
            every["env_timeouts"],
            path,
        )


def _batches(loader: Any) -> Iterator[DataProto]:
    for batch in loader:
        yield batch if isinstance(batch, DataProto) else DataProto.from_single_dict(batch)


def sample_scores(token_scores: Any, reward_metrics: dict[str, list[float]]) -> list[dict[str, Any]]:
    """Each sample's named scores and its ``overall`` (what the trainer's validation averages). A score that does not
    apply to a sample (a TRL function's None) is None, not the 0 it adds to ``overall``; a sample the reward failed
    on, or whose judge gave no grade, is marked ``FAILED_KEY``, its 0 being no answer's score."""
    named = {
        name: [None if math.isnan(v) else v for v in values.tolist()]
        for name, values in named_scores(reward_metrics).items()
    }
    # the batch holds the scores in float32: a file says the overall the reward gave (2/3 as the other scores
    # write it) where it is that float32, else the shortest decimal of the float32 (0.9, not 0.8999999761581421)
    given = named.get("overall")
    overall = [
        given[i] if given is not None and given[i] is not None and np.float32(given[i]) == value else float(str(value))
        for i, value in enumerate(np.asarray(token_scores.sum(-1), dtype=np.float32))
    ]
    # a judge that gave no grade (request failed, timed out, unreadable reply) scored its part 0: no answer's grade
    failed = failed_samples(reward_metrics, len(overall))
    scores = [{**{k: v[i] for k, v in named.items()}, "overall": overall[i]} for i in range(len(overall))]
    for score, flag in zip(scores, failed):
        if flag:
            score[FAILED_KEY] = True
    return scores


def _jsonable(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    return value


# ----------------------------------------------------------------------------------------------------------------------
# the run: data, Ray, workers, reward
# ----------------------------------------------------------------------------------------------------------------------
class GenerationRun:
    """The driver's side of `easyrl generate` / `easyrl eval`: the tokenizer and the validation loader (read before
    Ray starts, so bad data fails first), then the generation workers and the reward scorer; ``close`` releases
    them."""

    def __init__(
        self, plan: RunPlan, output: str, samples: int, settings: dict[str, Any], output_key: str = "generate.output"
    ) -> None:
        """``output``: the generation file the run appends to (the config key ``output_key`` names it), ``samples``
        per prompt, made with ``settings`` (``generation_settings``): an existing file is checked against the data and
        the settings first, and when it holds every prompt no worker is started."""
        from ..config.validate import check_generation_data
        from ..data.dataset import write_skipped_rows
        from ..data.loader import create_val_loader
        from .main import (
            check_reward_columns,
            check_rollout_takes_media,
            dataset_options,
            init_ray,
            load_model_side,
            load_run_reward,
        )

        check_generation_data(plan.config)
        self.plan = plan
        self.settings = settings
        self.log_file = setup_driver_logging(plan.config.trainer.save_checkpoint_path)
        self.tokenizer, processor, model_config = load_model_side(plan)
        self.reward_fn = load_run_reward(plan.config)
        options = dataset_options(plan.config, self.reward_fn)
        self.val_loader = create_val_loader(
            plan.config.data, self.tokenizer, processor, model_config=model_config, **options
        )
        check_reward_columns(plan.config, self.reward_fn, {"data.val_files": self.val_loader})
        check_rollout_takes_media(plan.config, {"data.val_files": self.val_loader})
        # every skipped row with its reason, beside the output (the warning names a few)
        self.skipped_rows_file = write_skipped_rows(
            f"{os.path.splitext(output)[0]}.skipped_rows.jsonl", [self.val_loader.dataset]
        )
        self.workers = None
        self.reward = None
        self.rollout = None
        self._workers_needed = False
        left = prompts_left(output, self.tokenizer, self.val_loader, samples, settings, output_key)
        if left is not None and plan.config.worker.reward.reward_function:
            unscored = drop_unscored_rows(output)  # after the check above: a refused file is left as it is
            if unscored:
                logger.warning(
                    "%s: %d rows held samples that were not fully scored (`%s`: the reward function failed on them or "
                    "the judge gave no grade): they are generated and scored again, with the seeds of their batches.",
                    output,
                    unscored,
                    FAILED_KEY,
                )
                left += unscored
        if left == 0:
            logger.warning("%s holds a row for every prompt of data.val_files: nothing to generate.", output)
            return
        if left is not None:
            total = len(self.val_loader.dataset)
            logger.warning(
                "%s holds the rows of %d of the %d prompts of data.val_files (an earlier run): generating the other %d.",
                output,
                total - left,
                total,
                left,
            )
        init_ray(plan)
        self._workers_needed = True

    def start_workers(self) -> None:
        """The generation workers and the reward scorer (after Ray started; nothing when no prompt is left)."""
        from .main import RunWorkers

        if not self._workers_needed:
            return
        config = self.plan.config
        self.workers = RunWorkers(self.plan, generation_only=True)
        try:
            groups = self.workers.start()
            self.rollout = groups.actor_rollout
            if config.worker.reward.reward_function:
                self.reward = self.workers.reward_scorer(self.tokenizer, self.reward_fn)
        except BaseException:
            self.close()
            raise

    def generate(
        self, path: str, request_for_batch: Callable[[int], GenerationRequest], samples: int
    ) -> GenerationSummary:
        return generate_to_file(
            self.plan,
            self.tokenizer,
            self.val_loader,
            self.rollout,
            self.reward,
            path,
            request_for_batch,
            samples,
            self.settings,
        )

    def close(self) -> None:
        if self.reward is not None:
            self.reward.shutdown()
            self.reward = None
        if self.workers is not None:
            self.workers.release()
            self.workers = None


def default_path(plan: RunPlan, configured: str | None, name: str) -> str:
    """``configured``, else ``<trainer.save_checkpoint_path>/<name>``, as an absolute path."""
    return os.path.abspath(
        os.path.expanduser(configured or os.path.join(plan.config.trainer.save_checkpoint_path, name))
    )


class GenerationStopped(KeyboardInterrupt):
    """A stop signal other than SIGINT (SIGTERM from a scheduler, SIGUSR1 before a time limit) while generating."""


@contextmanager
def stop_signals_raise(received: list[int]) -> Iterator[None]:
    """SIGTERM and SIGUSR1 raise ``GenerationStopped`` in the main thread until the block ends, as Ctrl-C raises
    KeyboardInterrupt, and are appended to ``received`` first: a wait inside Ray turns the exception into a plain
    KeyboardInterrupt, and `stop_keeps_rows` still names the signal. Installed once Ray has started: Ray's driver
    handler for SIGTERM exits silently with status 15."""
    from .faults import STOP_SIGNALS

    def handle(signum: int, frame: Any) -> None:
        received.append(signum)
        raise GenerationStopped(signum)

    others = [signum for signum in STOP_SIGNALS if signum != signal.SIGINT]
    previous = {signum: signal.getsignal(signum) for signum in others}
    for signum in others:
        signal.signal(signum, handle)
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


@contextmanager
def stop_keeps_rows(command: str, path: str, received: list[int]) -> Iterator[None]:
    """A stop signal (Ctrl-C, SIGTERM, SIGUSR1) ends `easyrl generate` / `easyrl eval` with one line, not a traceback:
    what is kept (the rows of every finished batch) and that the same command continues, and exit status 128 + the
    signal's number (130 for Ctrl-C, 143 for SIGTERM). ``received``: the signals `stop_signals_raise` caught (none:
    Ctrl-C's KeyboardInterrupt)."""
    try:
        yield
    except KeyboardInterrupt:
        signum = received[0] if received else signal.SIGINT
        kept = len({row["index"] for row in read_rows(path)})
        print(
            f"easyrl {command}: interrupted ({signal.Signals(signum).name}): {path} keeps the rows of {kept} "
            "prompts, every batch that was finished; rerunning the same command generates the others.",
            file=sys.stderr,
            flush=True,
        )
        raise SystemExit(128 + signum) from None


# the key naming each command's generation file
OUTPUT_KEYS = {"generate": "generate.output", "eval": "eval.generations"}


def generate_file(
    plan: RunPlan,
    command: str,
    path: str,
    request: GenerationRequest,
    samples: int,
    settings: dict[str, Any],
    seed_kind: int,
) -> tuple[GenerationSummary, GenerationRun]:
    """`easyrl generate` / `easyrl eval` (``command``): ``samples`` responses per prompt of data.val_files into
    ``path``, each batch sampled with the seed (worker.rollout.seed, ``seed_kind``, batch); the workers are released
    when it returns, and a stop signal (Ctrl-C, SIGTERM) ends it with one line (``stop_keeps_rows``)."""
    seed = plan.config.worker.rollout.seed
    received: list[int] = []
    with stop_keeps_rows(command, path, received):
        # Ray starts here (a stop then ends it at once)
        run = GenerationRun(plan, path, samples, settings, OUTPUT_KEYS[command])
        try:
            # from the workers' start on, which takes a while (engines load), not only while generating
            with stop_signals_raise(received):
                run.start_workers()
                summary = run.generate(
                    path, lambda batch: dataclasses.replace(request, seed=[seed, seed_kind, batch]), samples
                )
        finally:
            run.close()
    return summary, run


def run_generate(plan: RunPlan) -> GenerationSummary:
    """`easyrl generate`."""
    config = plan.config
    # not generations.jsonl: the trainer's file logger writes its validation samples there
    path = default_path(plan, config.generate.output, GENERATE_FILE)
    request = GenerationRequest(validate=config.generate.val_sampling)
    settings = generation_settings(plan, request)
    samples = settings["sampling"]["n"]
    summary, _ = generate_file(plan, "generate", path, request, samples, settings, GENERATE_SEED_KIND)
    print(
        f"{summary.prompts} prompts x {samples} samples in {summary.path} ({summary.generated} generated now"
        + (f", {summary.resumed} by an earlier run)" if summary.resumed else ")")
    )
    if config.worker.rollout.multi_turn.enabled:
        totals = multi_turn_totals(read_rows(path))
        warn_failing_tools(totals, path)
        if totals:
            print(describe_multi_turn(totals))
    return summary
