"""EasyR1 users' reward files and prompt templates work unchanged and mean what they mean in EasyR1.

Expected values are worked out by hand from EasyR1's reward manager and dataset code: the function called without
`:name`, REWARD_TYPE's default, the prompt file stripped before Jinja compiles it, and the shipped files standing in
for EasyR1's examples/ files only when they carry the same contract.
"""

import logging
import sys
from pathlib import Path

import pytest

from easyrl.data.template import PromptFormatter
from easyrl.paths import PROJECT_ROOT, resolve_shipped_file
from easyrl.workers.reward.loader import RewardFunctionError, load_reward_function, resolve_reward_function


DATA = Path(__file__).resolve().parent / "data"
BATCH_FILE = DATA / "easyr1_batch_reward.py"
SEQUENTIAL_FILE = DATA / "easyr1_sequential_reward.py"


def item(response, ground_truth, response_length=1):
    return {"response": response, "response_length": response_length, "ground_truth": ground_truth}


# ---- reward files in EasyR1's format
def test_batch_file_with_kwargs_is_called_once_with_the_whole_batch():
    fn = load_reward_function(f"{BATCH_FILE}:compute_score", {"scale": 2.0})
    scores = fn.score(
        [
            item(r"So \boxed{4}", "4"),  # right
            item(r"\boxed{\frac{1}{2}}", "0.5"),  # right: mathruler, 1/2 - 0.5 simplifies to 0
            item(r"\boxed{5}", "4"),  # wrong
            item("no box", "4"),  # mathruler reads "None": wrong
        ]
    )
    # mean accuracy 0.5; overall = 2 * (accuracy - 0.5)
    assert [s["overall"] for s in scores] == [1.0, 1.0, -1.0, -1.0]
    assert [s["accuracy"] for s in scores] == [1.0, 1.0, 0.0, 0.0]
    assert {s["batch_size"] for s in scores} == {4.0}
    assert (fn.reward_type, fn.reward_name) == ("batch", "batch_normalised")


def test_without_a_function_name_easyr1s_main_is_called():
    fn = load_reward_function(str(SEQUENTIAL_FILE), {"length_bonus": 0.1})
    assert (fn.name, fn.reward_type) == ("main", "sequential")
    scores = fn.score([item("2+2 = 4", "4", 5), item("x = 3.0", "3", 3), item("= five", "5", 2)])
    # overall = accuracy + 0.1 * response_length; mathruler: 3.0 == 3, "five" is not 5
    assert scores == [
        {"overall": 1.5, "accuracy": 1.0},
        {"overall": pytest.approx(1.3), "accuracy": 1.0},
        {"overall": pytest.approx(0.2), "accuracy": 0.0},
    ]


@pytest.mark.parametrize(
    ("source", "spec_suffix", "expected"),
    [
        ("def main(x):\n    pass\ndef compute_score(x):\n    pass\n", "", "main"),  # EasyR1's default wins
        ("def compute_score(x):\n    pass\n", "", "compute_score"),  # the name EasyR1's own files define
        ("from os.path import join as main\n", "", "main"),  # bound by an import: still `main`
        ("def main(x):\n    pass\ndef score(x):\n    pass\n", ":score", "score"),  # named: used as named
    ],
)
def test_function_rule_is_the_same_when_parsed_and_when_imported(tmp_path, source, spec_suffix, expected):
    path = tmp_path / "reward.py"
    path.write_text(source)
    spec = f"{path}{spec_suffix}"
    assert resolve_reward_function(spec) == (str(path.resolve()), expected)
    assert load_reward_function(spec).name == expected


def test_a_file_with_neither_main_nor_compute_score_lists_its_functions(tmp_path):
    path = tmp_path / "reward.py"
    path.write_text("def grade(x):\n    pass\ndef _helper():\n    pass\n")
    message = r"neither `main` \(EasyR1's default\) nor `compute_score`\. Functions found: grade\. Name one as"
    with pytest.raises(RewardFunctionError, match=message):
        resolve_reward_function(str(path))
    with pytest.raises(RewardFunctionError, match=message):
        load_reward_function(str(path))


def test_config_check_reports_a_syntax_error_without_running_the_file(tmp_path):
    path = tmp_path / "reward.py"
    path.write_text("raise SystemExit('executed')\ndef compute_score(x:\n")
    with pytest.raises(RewardFunctionError, match=r"reward.py` line 2"):
        resolve_reward_function(str(path))


def test_reward_type_defaults_to_batch_as_in_easyr1(tmp_path):
    path = tmp_path / "reward.py"
    path.write_text("def compute_score(items):\n    return [{'overall': float(len(items))} for _ in items]\n")
    assert load_reward_function(str(path)).score([item("a", "1"), item("b", "1")]) == [{"overall": 2.0}] * 2


def test_a_grader_that_cannot_be_imported_is_reported_not_hidden(monkeypatch):
    # mathruler's grader imports pylatexenc, which mathruler does not declare: make it missing, and make the
    # grader modules import afresh
    monkeypatch.setitem(sys.modules, "pylatexenc", None)
    for name in ("mathruler.grader", "easyrl.workers.reward.grading"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    for shipped in ("math.py", "r1v.py", "arithmetic.py"):
        with pytest.raises(RewardFunctionError, match=rf"importing .*{shipped}.*pylatexenc.*pip install pylatexenc"):
            load_reward_function(str(PROJECT_ROOT / "reward_function" / shipped))


# ---- prompt templates
PROMPT = "  What is 2+3?\n"


def render(name: str, content: str = PROMPT) -> str:
    return PromptFormatter(str(PROJECT_ROOT / "format_prompt" / name))(content)


def test_shipped_math_template_renders_easyr1s_prompt():
    assert render("math.jinja") == (
        "What is 2+3? You FIRST think about the reasoning process as an internal monologue and then provide the "
        "final answer. The reasoning process MUST BE enclosed within <think> </think> tags. The final answer MUST "
        "BE put in \\boxed{}."
    )


def test_shipped_r1v_template_renders_easyr1s_prompt():
    assert render("r1v.jinja") == (
        "What is 2+3? A conversation between User and Assistant. The user asks a question, and the Assistant "
        "solves it. The assistant first thinks about the reasoning process in the mind and then provides the user "
        "with the answer. The reasoning process and answer are enclosed within <think> </think> and <answer> "
        "</answer> tags, respectively, i.e., <think> reasoning process here </think><answer> answer here </answer>"
    )


def test_shipped_dapo_template_renders_easyr1s_prompt_with_its_literal_backslash_n():
    # EasyR1's dapo.jinja is one line holding the two characters `\` `n`, not line breaks: the model sees them
    assert render("dapo.jinja") == (
        "Solve the following math problem step by step. The last line of your response should be of the form "
        "Answer: $Answer (without quotes) where $Answer is the answer to the problem.\\n\\nWhat is 2+3?\\n\\n"
        'Remember to put your answer on its own line after "Answer:".'
    )


def test_shipped_android_gui_template_renders_easyr1s_game_rules_then_the_content():
    text = render("android_gui.jinja", "<image>")
    assert text.startswith("You are playing a number selection game. Your goal is to select the CORRECT number")
    for rule in (
        "* **GREEN light**: Select the LARGEST number",
        "* **RED light**: Select the SMALLEST number",
        "* **YELLOW light**: Select the MIDDLE number (not largest, not smallest)",
        "- 0 (left card)\n- 1 (middle card)\n- 2 (right card)",
    ):
        assert rule in text
    assert text.endswith("Do not include any explanation or other text.\n\n---\n\n<image>")


def test_template_file_is_stripped_before_rendering_as_in_easyr1(tmp_path):
    path = tmp_path / "mine.jinja"
    path.write_text("\n\n  Question: {{ content }}\nThink first.  \n\n")
    # the surrounding blank lines and spaces go; the content itself is not trimmed by this template
    assert PromptFormatter(str(path))(PROMPT) == "Question:   What is 2+3?\n\nThink first."


def test_unknown_template_variable_renders_empty_as_in_easyr1_and_is_announced(tmp_path, caplog):
    path = tmp_path / "extra.jinja"
    path.write_text("{{ content }} {{ question }}|{% if hint %}hint{% endif %}")
    with caplog.at_level(logging.WARNING, logger="easyrl.data.template"):
        formatter = PromptFormatter(str(path))
    assert formatter("x") == "x |"
    assert "`hint`, `question`" in caplog.text and "render as empty text" in caplog.text


# ---- EasyR1's examples/ paths
@pytest.mark.parametrize(
    ("path", "folder", "shipped"),
    [
        ("./examples/reward_function/dapo.py:compute_score", "reward_function", "reward_function/dapo.py"),
        ("./examples/reward_function/r1v.py", "reward_function", "reward_function/r1v.py"),
        ("./examples/format_prompt/math.jinja", "format_prompt", "format_prompt/math.jinja"),
        ("examples/reward_function/android_gui.py:compute_score", "reward_function", "reward_function/android_gui.py"),
        ("examples/format_prompt/android_gui.jinja", "format_prompt", "format_prompt/android_gui.jinja"),
        # EasyR1's first releases called the folder score_function
        ("./examples/score_function/math.py:compute_score", "reward_function", "reward_function/math.py"),
    ],
)
def test_missing_easyr1_example_path_is_served_by_the_equivalent_file_with_a_warning(
    tmp_path, monkeypatch, caplog, path, folder, shipped
):
    monkeypatch.chdir(tmp_path)  # no examples/ folder here
    with caplog.at_level(logging.WARNING, logger="easyrl.config.shipped"):
        resolved = resolve_shipped_file(path, folder)
    function = ":compute_score" if path.endswith(":compute_score") else ""
    assert resolved == str(PROJECT_ROOT / shipped) + function
    file = path.removesuffix(function)
    assert f"{file} does not exist; using the file easyrl ships, {PROJECT_ROOT / shipped}" in caplog.text
    assert "the same contract as EasyR1's" in caplog.text


def test_a_reward_spec_with_spaces_after_its_commas_names_the_functions(tmp_path):
    from easyrl.workers.reward.loader import parse_spec

    assert parse_spec("f.py:a, b") == ("f.py", "a,b")
    assert parse_spec("dir/f.py:compute_score") == ("dir/f.py", "compute_score")
    _, chosen = resolve_reward_function(
        str(PROJECT_ROOT / "reward_function" / "arithmetic.py") + ":compute_score, compute_score"
    )
    assert chosen == "compute_score,compute_score"


def test_missing_path_without_an_equivalent_is_left_for_the_check_to_report(tmp_path, monkeypatch, caplog):
    monkeypatch.chdir(tmp_path)
    with caplog.at_level(logging.WARNING, logger="easyrl.config.shipped"):
        # a name easyrl does not ship; a user's own folder is never swapped for a shipped file
        assert resolve_shipped_file("./examples/reward_function/gui_agent.py", "reward_function") == (
            "./examples/reward_function/gui_agent.py"
        )
        assert resolve_shipped_file("./my_rewards/math.py:compute_score", "reward_function") == (
            "./my_rewards/math.py:compute_score"
        )
        assert resolve_shipped_file("./examples/score_function/math.jinja", "format_prompt") == (
            "./examples/score_function/math.jinja"
        )
    assert caplog.text == ""
    with pytest.raises(RewardFunctionError, match=r"gui_agent.py` does not exist.*easyrl ships .*dapo.py, math.py"):
        resolve_reward_function("./examples/reward_function/gui_agent.py")


def test_existing_path_is_made_absolute_and_kept(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "reward_function").mkdir()
    (tmp_path / "reward_function" / "math.py").write_text("def main(x):\n    pass\n")
    resolved = resolve_shipped_file("reward_function/math.py:main", "reward_function")
    assert resolved == f"{tmp_path.resolve() / 'reward_function' / 'math.py'}:main"


def test_the_example_tool_configs_run_from_any_folder(tmp_path, monkeypatch, caplog):
    """The tool and environment files of the examples (tools/...) are served like reward and template files: a
    relative `tools/calculator.py` that does not exist where the run starts is easyrl's example, announced."""
    from easyrl.config.plan import load_run_plan

    monkeypatch.chdir(tmp_path)
    config = PROJECT_ROOT / "examples" / "smollm2_arithmetic_grpo_tools.yaml"
    plan = load_run_plan([f"config={config}"])
    assert plan.config.worker.rollout.multi_turn.tools == str(PROJECT_ROOT / "tools" / "calculator.py")
    assert "worker.rollout.multi_turn.tools: tools/calculator.py does not exist; using the file easyrl ships" in (
        caplog.text
    )
    env = {"calc": "tools/calculator.py:CalculatorEnv"}
    plan = load_run_plan(
        [
            f"config={PROJECT_ROOT / 'examples' / 'smollm2_arithmetic_grpo.yaml'}",
            f"worker.rollout.multi_turn.env={env}",
        ]
    )
    assert plan.config.worker.rollout.multi_turn.env == {
        "calc": f"{PROJECT_ROOT / 'tools' / 'calculator.py'}:CalculatorEnv"
    }
    assert "worker.rollout.multi_turn.env.calc: tools/calculator.py does not exist" in caplog.text
