"""The HTTP judge (worker.reward.judge.kind=http) against a real chat-completions server on 127.0.0.1 started here:
retries, timeouts, unreadable replies, the concurrency limit, the weighted sum with the rule reward, the config
check, and a 2-step GRPO run through `easyrl train` with the judge on."""

import json
import re
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pytest
import torch

from easyrl.config import ConfigError, RewardConfig, load_config
from easyrl.config.schema import JudgeConfig
from easyrl.protocol import DataProto, as_object_array
from easyrl.workers.reward.judge import (
    JUDGE_SILENT_STREAK,
    REQUEST_FAILED,
    TIMED_OUT,
    UNPARSABLE,
    HttpJudge,
    JudgeUnreachableError,
    compile_score_pattern,
    load_template,
    parse_score,
    render_messages,
)
from easyrl.workers.reward.loader import RewardFunctionError
from easyrl.workers.reward.scorer import RewardScorer, reduce_reward_metrics, scores_to_non_tensor
from tests.fixtures.trainer_runs import TWO_STEP_HALF_RULE_OVERRIDES, metrics_by_step, run_training, train_args


ROOT = Path(__file__).resolve().parent.parent


# ----------------------------------------------------------------------------------------------------------------------
# a chat-completions server whose answer each test scripts
# ----------------------------------------------------------------------------------------------------------------------
class Answer:
    def __init__(
        self,
        text: str = "",
        status: int = 200,
        delay_s: float = 0.0,
        finish_reason: str = "stop",
        html: str | None = None,
        **headers,
    ):
        self.text, self.status, self.delay_s, self.finish_reason = text, status, delay_s, finish_reason
        self.html = html  # sent as the whole body (text/html) instead of a chat completion
        self.headers = {key.replace("_", "-"): value for key, value in headers.items()}


class JudgeServer:
    """`script(message, attempt) -> Answer` decides each reply (attempt: 1 for the first request with this message).
    Counts requests per message and the most requests in flight at once."""

    def __init__(self, script: Callable[[str, int], Answer]):
        self.script = script
        self.attempts: Counter = Counter()
        self.requests: list[dict] = []
        self.headers: list[dict] = []
        self.in_flight = self.max_in_flight = 0
        self.lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                message = body["messages"][0]["content"]
                with server.lock:
                    server.in_flight += 1
                    server.max_in_flight = max(server.max_in_flight, server.in_flight)
                    server.attempts[message] += 1
                    server.requests.append({"path": self.path, **body})
                    server.headers.append(dict(self.headers))
                    answer = server.script(message, server.attempts[message])
                try:
                    time.sleep(answer.delay_s)
                    reply = {"choices": [{"message": {"role": "assistant", "content": answer.text}}]}
                    reply["choices"][0]["finish_reason"] = answer.finish_reason
                    payload = json.dumps(reply).encode() if answer.status == 200 else b'{"error": "scripted"}'
                    if answer.html is not None:
                        payload = answer.html.encode()
                    self.send_response(answer.status)
                    for key, value in answer.headers.items():
                        self.send_header(key, value)
                    self.send_header("Content-Type", "application/json" if answer.html is None else "text/html")
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                except (BrokenPipeError, ConnectionResetError):  # the client gave up (a timeout): nothing to send
                    pass
                finally:
                    with server.lock:
                        server.in_flight -= 1

            def log_message(self, *args):  # quiet
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()
        self.base_url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


def scores_from_message(message: str, attempt: int) -> Answer:
    """The default script: `flaky` fails with 503 once, `garbage` has no number, `slow` answers after 3 s, `cut` is
    cut at max_tokens, `high` is off the scale, `refused` is a 400; else the grade is the message's length mod 11."""
    if "flaky" in message and attempt == 1:
        return Answer(status=503)
    if "busy" in message and attempt == 1:
        return Answer(status=429, retry_after="0")
    if "down" in message:
        return Answer(status=503)
    if "refused" in message:
        return Answer(status=400)
    if "garbage" in message:
        return Answer("I would rather not grade this.")
    if "slow" in message:
        return Answer("Score: 9", delay_s=3.0)
    if "cut" in message:
        return Answer("The answer is close to 7 but", finish_reason="length")
    if "high" in message:
        return Answer("Score: 15")
    if "grade=" in message:
        return Answer(f"Reasoning. Score: {message.split('grade=')[1].split()[0]}")
    return Answer(f"It is fine.\nScore: {len(message) % 11}")


@pytest.fixture
def server():
    judge_server = JudgeServer(scores_from_message)
    yield judge_server
    judge_server.close()


@pytest.fixture
def response_only_template(tmp_path):
    path = tmp_path / "judge.jinja"
    path.write_text("{{ response }}")
    return str(path)


def make_judge(server, template, **overrides) -> HttpJudge:
    settings = {"kind": "http", "base_url": server.base_url, "model": "judge-model", "prompt_template": template}
    settings.update(max_retries=2, retry_backoff_s=0.01, timeout_s=1.0)
    settings.update(overrides)
    return HttpJudge(JudgeConfig(**settings))


def judge_responses(judge: HttpJudge, responses: list[str]):
    inputs = [{"response": text, "response_length": 1, "ground_truth": "5"} for text in responses]
    return judge.score(["the question"] * len(responses), inputs)


# ----------------------------------------------------------------------------------------------------------------------
# the client
# ----------------------------------------------------------------------------------------------------------------------
def test_scores_are_read_from_the_last_number_and_mapped_from_score_range(server, response_only_template):
    judge = make_judge(server, response_only_template)
    try:
        verdicts = judge_responses(judge, ["grade=7", "grade=0", "grade=10", "grade=2.5"])
    finally:
        judge.close()
    assert [v.score for v in verdicts] == [0.7, 0.0, 1.0, 0.25]
    assert all(v.failure is None for v in verdicts)
    request = server.requests[0]
    assert request["path"] == "/v1/chat/completions"
    assert (request["model"], request["temperature"], request["max_tokens"]) == ("judge-model", 0.0, 512)


def test_a_503_or_429_is_retried_and_then_scores(server, response_only_template):
    judge = make_judge(server, response_only_template)
    try:
        verdicts = judge_responses(judge, ["flaky grade=6", "busy grade=4"])
    finally:
        judge.close()
    assert [v.score for v in verdicts] == [0.6, 0.4]
    assert all(v.failure is None for v in verdicts)
    assert server.attempts == {"flaky grade=6": 2, "busy grade=4": 2}


def test_a_request_failing_after_every_retry_or_refused_scores_zero(server, response_only_template):
    judge = make_judge(server, response_only_template, max_retries=2)
    try:
        verdicts = judge_responses(judge, ["down", "refused", "grade=3"])
    finally:
        judge.close()
    assert [v.score for v in verdicts] == [0.0, 0.0, 0.3]
    assert verdicts[0].failure.kind == verdicts[1].failure.kind == REQUEST_FAILED
    assert "HTTP 503" in verdicts[0].failure.detail and "after 3 attempts" in verdicts[0].failure.detail
    assert "HTTP 400" in verdicts[1].failure.detail
    assert server.attempts["down"] == 3  # max_retries=2: one try and two retries
    assert server.attempts["refused"] == 1  # a 4xx other than 429 is not retried


def test_unreadable_replies_score_zero_as_unparsable_and_are_logged_once(server, response_only_template, caplog):
    judge = make_judge(server, response_only_template)
    try:
        with caplog.at_level("WARNING", logger="easyrl.workers.reward.judge"):
            verdicts = judge_responses(judge, ["garbage", "high", "cut", "grade=8"])
            judge_responses(judge, ["garbage again"])  # the same kind again: not logged again
    finally:
        judge.close()
    messages = [record.getMessage() for record in caplog.records]
    # the failure kind is logged once; the second batch, scored for no sample, is said as such
    assert len([m for m in messages if "samples of this batch get judge score 0" in m]) == 1
    assert len([m for m in messages if "gave a score to no sample of this batch (1;" in m]) == 1
    assert len(messages) == 2
    assert "sample 0 unparsable" in caplog.text and "3 of 4 samples of this batch" in caplog.text
    assert [v.score for v in verdicts] == [0.0, 0.0, 0.0, 0.8]
    assert [v.failure.kind for v in verdicts[:3]] == [UNPARSABLE] * 3
    assert "no match" in verdicts[0].failure.detail
    assert "15 is outside score_range [0, 10]" in verdicts[1].failure.detail
    assert "max_tokens=512" in verdicts[2].failure.detail


def test_a_slow_answer_times_out_without_retry_and_the_rest_is_scored(server, response_only_template):
    judge = make_judge(server, response_only_template, timeout_s=0.5)
    try:
        start = time.monotonic()
        verdicts = judge_responses(judge, ["slow", "grade=5"])
        elapsed = time.monotonic() - start
    finally:
        judge.close()
    assert verdicts[0].score == 0.0 and verdicts[0].failure.kind == TIMED_OUT
    assert verdicts[1].score == 0.5
    assert server.attempts["slow"] == 1
    assert elapsed < 2.5  # the 3 s answer was not waited for


def test_no_more_requests_than_concurrency_are_in_flight(server, response_only_template):
    server.script = lambda message, attempt: Answer("Score: 1", delay_s=0.3)
    judge = make_judge(server, response_only_template, concurrency=3)
    try:
        verdicts = judge_responses(judge, [f"sample {i}" for i in range(12)])
    finally:
        judge.close()
    assert [v.score for v in verdicts] == [0.1] * 12
    assert server.max_in_flight == 3


def test_the_key_is_read_from_the_named_variable(server, response_only_template):
    config = JudgeConfig(
        kind="http",
        base_url=server.base_url,
        model="m",
        prompt_template=response_only_template,
        api_key_env="JUDGE_KEY",
    )
    judge = HttpJudge(config, environ={"JUDGE_KEY": "s3cret"})
    try:
        judge_responses(judge, ["grade=1"])
    finally:
        judge.close()
    assert server.headers[0]["Authorization"] == "Bearer s3cret"


def test_a_first_batch_with_no_reply_at_all_stops_but_later_failures_only_count(server, response_only_template):
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        closed_port = probe.getsockname()[1]
    unreachable = make_judge(server, response_only_template, base_url=f"http://127.0.0.1:{closed_port}/v1")
    try:
        with pytest.raises(JudgeUnreachableError, match=f"127.0.0.1:{closed_port}/v1/chat/completions"):
            judge_responses(unreachable, ["grade=1", "grade=2"])
    finally:
        unreachable.close()

    judge = make_judge(server, response_only_template)
    try:
        assert [v.score for v in judge_responses(judge, ["grade=1"])] == [0.1]
        server.script = lambda message, attempt: Answer(status=404)
        verdicts = judge_responses(judge, ["grade=1", "grade=2"])  # not the first batch: counted, not raised
    finally:
        judge.close()
    assert [v.failure.kind for v in verdicts] == [REQUEST_FAILED] * 2


def test_a_hanging_judge_stops_at_the_first_batch(server, response_only_template):
    server.script = lambda message, attempt: Answer("Score: 9", delay_s=2.0)
    judge = make_judge(server, response_only_template, timeout_s=0.3)
    try:
        with pytest.raises(RewardFunctionError) as stopped:  # easyrl train: its message alone, exit 2
            judge_responses(judge, ["grade=1", "grade=2", "grade=3"])
    finally:
        judge.close()
    assert isinstance(stopped.value, JudgeUnreachableError)
    message = str(stopped.value)
    assert "none of the 3 samples of its first batch: 3 timed out after worker.reward.judge.timeout_s=0.3 s" in message
    assert "The first failure (timed out): no reply within timeout_s=0.3 s" in message
    assert "worker.reward.judge.base_url" in message and "worker.reward.judge.timeout_s" in message


def test_a_web_page_instead_of_a_judge_stops_at_the_first_batch(server, response_only_template):
    page = "<!DOCTYPE html><html><head><title>Welcome to nginx!</title></head><body>It works.</body></html>"
    server.script = lambda message, attempt: Answer(html=page)
    judge = make_judge(server, response_only_template)
    try:
        with pytest.raises(JudgeUnreachableError) as stopped:
            judge_responses(judge, ["grade=1", "grade=2"])
    finally:
        judge.close()
    message = str(stopped.value)
    assert f"The judge at {server.base_url}/chat/completions (model `judge-model`)" in message
    assert "none of the 2 samples of its first batch: 2 had no readable score" in message
    assert "not a chat completion: '<!DOCTYPE html><html><head><title>Welcome to nginx!" in message
    assert "worker.reward.judge.base_url" in message and "worker.reward.judge.score_pattern" in message


def test_replies_that_never_match_the_pattern_stop_and_mixed_failures_are_counted(server, response_only_template):
    judge = make_judge(server, response_only_template, max_retries=0)
    try:
        with pytest.raises(JudgeUnreachableError) as stopped:
            judge_responses(judge, ["garbage", "garbage 2", "refused"])
    finally:
        judge.close()
    message = str(stopped.value)
    assert "none of the 3 samples of its first batch: 2 had no readable score, 1 got no usable HTTP reply" in message
    assert "The first failure (unparsable): no match of score_pattern" in message


def test_a_first_batch_with_some_scores_goes_on_until_the_judge_is_silent_for_a_streak(
    server, response_only_template, caplog
):
    judge = make_judge(server, response_only_template, timeout_s=0.5)
    try:
        verdicts = judge_responses(judge, ["garbage", "slow", "refused", "grade=4"])  # one score: the judge works
        assert [v.score for v in verdicts] == [0.0, 0.0, 0.0, 0.4]
        assert [v.failure.kind for v in verdicts[:3]] == [UNPARSABLE, TIMED_OUT, REQUEST_FAILED]
        with caplog.at_level("WARNING", logger="easyrl.workers.reward.judge"):
            for _ in range(JUDGE_SILENT_STREAK - 1):  # silent batches after a scored one: counted, not raised
                judge_responses(judge, ["garbage"])
        # and said at once, each (the failures themselves are logged once per run)
        silent = [
            r.getMessage() for r in caplog.records if "gave a score to no sample of this batch" in r.getMessage()
        ]
        assert len(silent) == JUDGE_SILENT_STREAK - 1
        assert silent[-1].endswith(
            f"the run stops after {JUDGE_SILENT_STREAK} such batches in a row (this is {JUDGE_SILENT_STREAK - 1})."
        )
        judge_responses(judge, ["grade=2"])  # a score ends the streak
        for _ in range(JUDGE_SILENT_STREAK - 1):
            judge_responses(judge, ["garbage", "refused"])
        with pytest.raises(JudgeUnreachableError, match=f"{JUDGE_SILENT_STREAK} batches in a row"):
            judge_responses(judge, ["garbage", "refused"])
    finally:
        judge.close()


def test_score_pattern_uses_its_last_match_and_one_group():
    pattern = compile_score_pattern(r"Score: (\d+)")
    assert parse_score("Score: 3 at first, then Score: 8", pattern, [0, 10]) == 0.8
    assert parse_score("0.5", compile_score_pattern(r"([0-9.]+)"), [0, 1]) == 0.5
    with pytest.raises(ValueError, match="exactly one"):
        compile_score_pattern(r"(\d+)/(\d+)")


@pytest.mark.parametrize(
    ("reply", "score"),
    [
        ("Right, but terse.\nScore: 7", 0.7),
        ("Partly right, step 2 is wrong.\nScore: 3/10", 0.3),  # the last number read the 10: every answer full marks
        ("Score: 3 (out of 10)", 0.3),
        ("**Score:** 4\n\nNote: the answer uses 2 steps.", 0.4),  # the last number read the 2
        ("The score is low.\nscore = 6.5", 0.65),
        ("Score: -2", None),  # off the scale, not its absolute value
        ("I would give it 7.", None),  # no Score: a judge error, counted, not a guess
    ],
)
def test_the_default_score_pattern_reads_the_number_after_the_last_score(reply, score):
    """The default read the reply's last number: `Score: 3/10` paid the maximum, `Score: -2` paid 0.2."""
    pattern = compile_score_pattern(JudgeConfig().score_pattern)
    if score is None:
        with pytest.raises(ValueError):
            parse_score(reply, pattern, [0, 10])
    else:
        assert parse_score(reply, pattern, [0, 10]) == pytest.approx(score)


def test_a_ground_truth_that_is_not_text_reaches_the_template_as_json():
    template = load_template(None)
    tests = {"inputs": ["1 2\n"], "outputs": ["3\n"]}
    [message] = render_messages(template, ["Add."], [{"response": "print(3)", "ground_truth": tests}])
    assert json.dumps(tests) in message and "'inputs'" not in message
    [message] = render_messages(template, ["Add."], [{"response": "3", "ground_truth": "3"}])
    assert "Reference answer:\n3\n" in message


# ----------------------------------------------------------------------------------------------------------------------
# the scorer: the weighted sum with the rule reward
# ----------------------------------------------------------------------------------------------------------------------
def judged_batch(tokenizer, prompts, responses, truths, width=24) -> DataProto:
    """Left-padded prompts and right-padded responses with their attention mask, as the rollout returns them."""

    def pad(rows, left):
        ids = torch.full((len(rows), width), tokenizer.pad_token_id, dtype=torch.long)
        mask = torch.zeros(len(rows), width, dtype=torch.long)
        for i, row in enumerate(rows):
            span = slice(width - len(row), width) if left else slice(0, len(row))
            ids[i, span], mask[i, span] = torch.tensor(row), 1
        return ids, mask

    prompt_ids, prompt_mask = pad([tokenizer.encode(text, add_special_tokens=False) for text in prompts], left=True)
    response_rows = [tokenizer.encode(t, add_special_tokens=False) + [tokenizer.eos_token_id] for t in responses]
    response_ids, response_mask = pad(response_rows, left=False)
    return DataProto.from_dict(
        tensors={
            "prompts": prompt_ids,
            "responses": response_ids,
            "response_mask": response_mask,
            "attention_mask": torch.cat([prompt_mask, response_mask], dim=-1),
        },
        non_tensors={"ground_truth": np.array(truths, dtype=object)},
    )


def test_overall_is_the_weighted_sum_of_rule_and_judge(tokenizer, server, tmp_path):
    template = tmp_path / "judge.jinja"
    template.write_text("Q: {{ prompt }} | A: {{ response }} | R: {{ ground_truth }}")
    grades = {r"\boxed{12}": "Score: 8", r"\boxed{7}": "Score: 3", "no idea": "I cannot tell."}
    server.script = lambda message, attempt: Answer(next(g for r, g in grades.items() if f"A: {r} |" in message))
    config = RewardConfig(
        reward_function=str(ROOT / "reward_function" / "arithmetic.py"),
        rule_weight=0.5,
        judge=JudgeConfig(
            kind="http", weight=2.0, base_url=server.base_url, model="m", prompt_template=str(template), max_retries=0
        ),
    )
    scorer = RewardScorer(config, tokenizer, in_process=True)
    data = judged_batch(tokenizer, ["5 + 7 = ?", "3 + 5 = ?", "1 + 2 = ?"], list(grades), ["12", "8", "3"])
    try:
        token_level_scores, metrics = scorer.score(data)
    finally:
        scorer.shutdown()
    # rule (arithmetic.py): 0.1 x format + 0.9 x accuracy = 1.0, 0.1, 0.0; judge: 8/10, 3/10, unreadable -> 0
    # overall = 0.5 x rule + 2.0 x judge = 0.5 + 1.6, 0.05 + 0.6, 0 + 0
    assert metrics["reward/rule"] == pytest.approx([1.0, 0.1, 0.0])
    assert metrics["reward/judge"] == pytest.approx([0.8, 0.3, 0.0])
    assert metrics["reward/overall"] == pytest.approx([2.1, 0.65, 0.0])
    assert token_level_scores.sum(-1).tolist() == pytest.approx([2.1, 0.65, 0.0])
    assert metrics["reward/judge_errors"] == [0.0, 0.0, 1.0]
    assert metrics["reward/accuracy"] == [1.0, 0.0, 0.0]  # the function's other scores are kept
    assert reduce_reward_metrics(metrics) == {
        "reward/overall": pytest.approx(2.75 / 3),
        "reward/rule": pytest.approx(1.1 / 3),
        "reward/judge": pytest.approx(1.1 / 3),
        "reward/format": pytest.approx(2 / 3),
        "reward/accuracy": pytest.approx(1 / 3),
        "reward/errors": 0.0,
        "reward/timeouts": 0.0,
        "reward/judge_errors": 1.0,
    }
    assert "judge_errors" not in scores_to_non_tensor(metrics)
    # `easyrl generate` / `eval` files: the ungraded sample is marked, not a judge's 0 among others
    from easyrl.trainer.generate import FAILED_KEY, sample_scores

    assert [FAILED_KEY in score for score in sample_scores(token_level_scores, metrics)] == [False, False, True]
    # the judge saw the decoded prompt, the response and the answer
    assert sorted(r["messages"][0]["content"] for r in server.requests)[0] == r"Q: 1 + 2 = ? | A: no idea | R: 3"


def test_the_judge_reads_the_question_from_the_prompt_messages(tokenizer, server, tmp_path):
    """A dataset with a judge on carries each prompt's messages: the judge gets the last user message, not the
    policy's chat template (with the template's system prompt) decoded."""
    template = tmp_path / "judge.jinja"
    template.write_text("Q: {{ prompt }} | A: {{ response }}")
    server.script = lambda message, attempt: Answer("Score: 5")
    config = RewardConfig(
        reward_function=str(ROOT / "reward_function" / "arithmetic.py"),
        judge=JudgeConfig(kind="http", base_url=server.base_url, model="m", prompt_template=str(template)),
    )
    system = {"role": "system", "content": "Be brief."}
    messages = [[system, {"role": "user", "content": "5 + 7 = ?"}], [{"role": "user", "content": "3 + 5 = ?"}]]
    templated = [
        tokenizer.apply_chat_template(turns, tokenize=False, add_generation_prompt=True) for turns in messages
    ]
    data = judged_batch(tokenizer, templated, [r"\boxed{12}", "8"], ["12", "8"], width=48)
    data.non_tensor_batch["prompt_messages"] = as_object_array(messages)
    scorer = RewardScorer(config, tokenizer, in_process=True)
    try:
        scorer.score(data)
    finally:
        scorer.shutdown()
    seen = sorted(request["messages"][0]["content"] for request in server.requests)
    assert seen == [r"Q: 3 + 5 = ? | A: 8", r"Q: 5 + 7 = ? | A: \boxed{12}"]


# ----------------------------------------------------------------------------------------------------------------------
# the config check
# ----------------------------------------------------------------------------------------------------------------------
def http_judge_args(valid_args, base_url="http://127.0.0.1:8000/v1", *extra):
    return [*valid_args, "worker.reward.judge.kind=http", f"worker.reward.judge.base_url={base_url}",
            "worker.reward.judge.model=judge", *extra]  # fmt: skip


def test_check_accepts_an_http_judge_with_the_builtin_template(valid_args):
    config = load_config(http_judge_args(valid_args, "https://api.example.com/v1", "worker.reward.rule_weight=0.3"))
    assert (config.worker.reward.rule_weight, config.worker.reward.judge.score_range) == (0.3, [0, 10])


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["worker.reward.judge.kind=grade"], "`worker.reward.judge.kind` is `grade`, which is not one of: none, http"),
        (["worker.reward.judge.model=null"], "`worker.reward.judge.model` is not set"),
        (["worker.reward.judge.base_url=localhost:8000"], "give an http:// or https:// URL"),
        (["worker.reward.judge.base_url=http://h:8000/v1/chat/completions"], "without `/chat/completions`"),
        (["worker.reward.judge.weight=0"], "its score never used"),
        (["worker.reward.judge.concurrency=0"], "`worker.reward.judge.concurrency` is 0; it must be >= 1"),
        (["worker.reward.judge.score_pattern=Score \\d+"], "it has 0 groups; it needs exactly one"),
        (["worker.reward.judge.score_pattern=(unclosed"], "not a valid regular expression"),
        (["worker.reward.judge.score_range=[10,0]"], "give [min, max] of the judge's scale"),
        (["worker.reward.judge.api_key_env=EASYRL_TEST_UNSET_KEY"], "EASYRL_TEST_UNSET_KEY is not set"),
        (["worker.reward.judge.api_key_env=sk-live-1234"], "never the key itself"),
        (["worker.reward.judge.prompt_template=/nowhere/judge.jinja"], "judge prompt template file"),
    ],
)
def test_check_refuses_a_judge_it_cannot_run(valid_args, extra, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace("[", r"\[")):
        load_config(http_judge_args(valid_args, "http://127.0.0.1:8000/v1", *extra))


def test_a_pattern_with_a_colon_is_text_on_the_command_line_and_a_template_not_asking_for_a_score_is_refused(
    valid_args, tmp_path
):
    """YAML read `score_pattern=Score: ([0-9]+)`, the README's own pattern, as a mapping and refused it; a template
    that never asks for a `Score` gets no reply the default pattern reads: the run stopped at its first batch."""
    config = load_config(
        http_judge_args(valid_args, "http://h:1/v1", "worker.reward.judge.score_pattern=Score: ([0-9]+)")
    )
    assert config.worker.reward.judge.score_pattern == "Score: ([0-9]+)"
    template = tmp_path / "rate.jinja"
    template.write_text("Rate this answer from 0 to 10, the number alone: {{ response }}")
    given = f"worker.reward.judge.prompt_template={template}"
    with pytest.raises(ConfigError, match="never says `score`.*'\\(\\[0-9\\]\\+\\)' reads the last number"):
        load_config(http_judge_args(valid_args, "http://h:1/v1", given))
    last_number = load_config(
        http_judge_args(valid_args, "http://h:1/v1", given, "worker.reward.judge.score_pattern=([0-9]+)")
    )
    assert last_number.worker.reward.judge.prompt_template == str(template)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{{ prompt }}", "never uses `{{ response }}`"),
        ("{{ response }} {{ answer }}", "it uses ['answer']"),
        ("{{ response ", "not a valid Jinja template"),
    ],
)
def test_check_refuses_a_template_it_cannot_render(valid_args, tmp_path, text, message):
    template = tmp_path / "judge.jinja"
    template.write_text(text)
    with pytest.raises(ConfigError) as refused:
        load_config(http_judge_args(valid_args, "http://h:1/v1", f"worker.reward.judge.prompt_template={template}"))
    assert f"`worker.reward.judge.prompt_template` (`{template}`)" in str(refused.value)
    assert message in str(refused.value)


def test_check_refuses_a_rule_weight_without_a_judge(valid_args):
    with pytest.raises(ConfigError, match="no judge is set"):
        load_config([*valid_args, "worker.reward.rule_weight=0.5"])


# ----------------------------------------------------------------------------------------------------------------------
# end to end
# ----------------------------------------------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_two_grpo_steps_train_with_the_judge_in_the_reward(tiny_model_path, tmp_path, server):
    """`easyrl train` on the tiny model (one worker) with the judge at the local server: every step's reward is the
    weighted sum of the rule reward and the judge's grade, and the judge saw every sample."""
    save_dir, log_path = tmp_path / "run", tmp_path / "train.log"
    overrides = TWO_STEP_HALF_RULE_OVERRIDES + [
        "worker.reward.judge.kind=http",
        "worker.reward.judge.weight=0.25",
        f"worker.reward.judge.base_url={server.base_url}",
        "worker.reward.judge.model=tiny-judge",
        "worker.reward.judge.retry_backoff_s=0.01",
    ]
    run_training(train_args(tiny_model_path, save_dir, overrides), log_path, timeout=540)
    rows = metrics_by_step(save_dir)
    assert sorted(rows) == [1, 2]
    for step, row in rows.items():
        # 4 prompts x 4 samples per step; the means combine like the samples: 0.5 x rule + 0.25 x judge
        assert row["reward/overall"] == pytest.approx(0.5 * row["reward/rule"] + 0.25 * row["reward/judge"]), step
        assert row["reward/word_share"] == pytest.approx(row["reward/rule"])
        assert row["reward/judge_errors"] == 0.0
        assert 0.0 <= row["reward/judge"] <= 1.0
        assert "actor/kl_coef" not in row  # the demo recipe's KL is off (disable_kl): no coefficient to report
    assert len(server.requests) == 2 * 16
    assert all(request["model"] == "tiny-judge" for request in server.requests)
    assert all("Answer to grade:" in request["messages"][0]["content"] for request in server.requests)  # built-in
    # the question as the data gave it (format_prompt applied), not the policy's chat template around it
    questions = {
        request["messages"][0]["content"].split("Question:\n")[1].split("\n\nReference")[0]
        for request in server.requests
    }
    assert questions and all(re.fullmatch(r"What is \d+ [-+*] \d+\?.*", q, re.S) for q in questions), questions
    assert not any("SmolLM" in q or "\nuser\n" in q or "assistant" in q for q in questions)


def test_a_judge_nothing_answers_at_is_said_before_ray_and_one_that_listens_is_not(valid_args, caplog):
    """A wrong base_url was found after Ray, the workers' start and the first rollout (minutes on a GPU node): the
    driver now tries the host and port first and warns (a job may start its server beside the run: no refusal)."""
    from easyrl.trainer.main import load_run_reward
    from easyrl.workers.reward.judge import unreachable_judge

    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        port = listening.getsockname()[1]
        assert unreachable_judge(JudgeConfig(kind="http", base_url=f"http://127.0.0.1:{port}/v1", model="j")) is None
    # the port closed: nothing listens there now
    closed = JudgeConfig(kind="http", base_url=f"http://127.0.0.1:{port}/v1", model="j")
    problem = unreachable_judge(closed)
    assert problem.startswith(f"nothing answers at 127.0.0.1:{port} (worker.reward.judge.base_url=http://127.0.0.1:")
    assert "The run goes on, and stops at the first batch the judge does not score" in problem
    assert unreachable_judge(JudgeConfig(kind="none")) is None
    # the driver says it while loading the reward, before Ray starts
    config = load_config(
        [
            *valid_args,
            "worker.reward.judge.kind=http",
            f"worker.reward.judge.base_url=http://127.0.0.1:{port}/v1",
            "worker.reward.judge.model=j",
            "worker.reward.judge.weight=0.5",
            "worker.reward.rule_weight=0.5",
        ]
    )
    with caplog.at_level("WARNING", logger="easyrl.trainer.main"):
        assert load_run_reward(config) is not None
    assert any(f"The judge: nothing answers at 127.0.0.1:{port}" in record.getMessage() for record in caplog.records)
