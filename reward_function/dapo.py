"""DAPO reward (Yu et al. 2025, arXiv 2503.14476) with EasyR1's contract (its examples/reward_function/dapo.py):
same inputs, same scores, same keys.

    answer   = the text after the last `Answer:` (any case, spaces allowed around the colon) up to the end of
               its line, searched in the last 300 characters of the response; none: the answer is "[INVALID]"
    accuracy = +1 if normalize(answer) == normalize(ground truth), else -1   (normalize: below)
    overlong = R_length of section 3.4 (soft overlong punishment), with L_max = max_response_length and
               L_cache = overlong_buffer_length, for a response of |y| tokens:
                   0                                 if |y| <= L_max - L_cache
                   ((L_max - L_cache) - |y|) / L_cache  if L_max - L_cache < |y| <= L_max
                   -1                                if |y| > L_max
    overall  = accuracy + overlong_penalty_factor * overlong
    accuracy_normalized = (accuracy + 1) / 2, i.e. 1 / 0: the key EasyR1's DAPO recipe filters groups on
               (algorithm.filter_key: accuracy_normalized)

The three keyword arguments have no defaults, as in EasyR1: set them with worker.reward.reward_function_kwargs,
e.g. {max_response_length: 20480, overlong_buffer_length: 4096, overlong_penalty_factor: 1.0}.

`normalize` is the answer normalisation of Minerva (Lewkowycz et al. 2022, arXiv 2206.14858, appendix D) that
DAPO's verifier uses: keep the part after the last `=`, apply fixed text substitutions and deletions (units,
`\\text{}`, `\\!`...), unwrap `$...$`, `\\text{}`, `\\textbf{}`, `\\overline{}`, `\\boxed{}`, brace shorthand
`\\frac12` / `\\sqrt2`, drop `$`, and drop the thousands commas of a plain integer.
"""

import re


REWARD_NAME = "dapo"
REWARD_TYPE = "batch"

ANSWER_WINDOW = 300  # characters at the end of a response searched for the answer line
NO_ANSWER = "[INVALID]"

_ANSWER_LINE = re.compile(r"answer\s*:\s*([^\n]+)", re.IGNORECASE)

# Minerva's normalisation tables, applied in this order (the order matters: "an " goes before "a ").
_REPLACED = (
    ("an ", ""),
    ("a ", ""),
    (".$", "$"),
    ("\\$", ""),
    ("\\ ", ""),
    (" ", ""),
    ("mbox", "text"),
    (",\\text{and}", ","),
    ("\\text{and}", ","),
    ("\\text{m}", "\\text{}"),
)
_DELETED = (
    *("square", "ways", "integers", "dollars", "mph", "inches", "hours", "km", "units", "\\ldots", "sue"),
    *("points", "feet", "minutes", "digits", "cents", "degrees", "cm", "gm", "pounds", "meters", "meals"),
    *("edges", "students", "childrentickets", "multiples"),
    *("\\text{s}", "\\text{.}", "\\text{\ns}", "\\text{}^2", "\\text{}^3", "\\text{\n}", "\\text{}"),
    *("\\mathrm{th}", "^\\circ", "^{\\circ}", "\\;", ",\\!", "{,}", '"', "\\dots"),
)
# (pattern, replacement) rewrites, in order
_REWRITES = tuple(
    (re.compile(pattern), replacement)
    for pattern, replacement in (
        (r"(.*?)(\$)(.*?)(\$)(.*)", r"$\3$"),  # keep only the first $...$ span
        (r"(\\text\{)(.*?)(\})", r"\2"),
        (r"(\\textbf\{)(.*?)(\})", r"\2"),
        (r"(\\overline\{)(.*?)(\})", r"\2"),
        (r"(\\boxed\{)(.*)(\})", r"\2"),
        (r"(frac)([^{])(.)", r"frac{\2}{\3}"),  # \frac12 -> \frac{1}{2}
        (r"(sqrt)([^{])", r"sqrt{\2}"),  # \sqrt2 -> \sqrt{2}
    )
)


def normalize(answer: str) -> str:
    """Minerva's canonical form of a final answer (see the module docstring)."""
    text = answer.split("=")[-1]
    for old, new in _REPLACED:
        text = text.replace(old, new)
    for old in _DELETED:
        text = text.replace(old, "")
    for pattern, replacement in _REWRITES:
        text = pattern.sub(replacement, text)
    text = text.replace("$", "")
    if text.replace(",", "").isdigit():
        text = text.replace(",", "")
    return text.strip()


def final_answer(response: str) -> str:
    lines = _ANSWER_LINE.findall(response[-ANSWER_WINDOW:])
    return lines[-1] if lines else NO_ANSWER


def answer_text(ground_truth: str | int | float) -> str:
    """A number in the answer column (a parquet column of ints, or of floats where some rows lack a value) as the
    text an answer line would hold: 72 and 72.0 -> "72". EasyR1's dapo.py raised on them."""
    if isinstance(ground_truth, float) and ground_truth.is_integer():
        return str(int(ground_truth))
    return str(ground_truth)


def accuracy_reward(response: str, ground_truth: str | int | float) -> float:
    return 1.0 if normalize(final_answer(response)) == normalize(answer_text(ground_truth)) else -1.0


def overlong_reward(response_length: int, max_response_length: int, overlong_buffer_length: int) -> float:
    """R_length in [-1, 0] (see the module docstring)."""
    expected_length = max_response_length - overlong_buffer_length
    if response_length <= expected_length:
        return 0.0
    if response_length <= max_response_length:
        return (expected_length - response_length) / overlong_buffer_length
    return -1.0


def compute_score(
    reward_inputs: list[dict],
    max_response_length: int,
    overlong_buffer_length: int,
    overlong_penalty_factor: float,
) -> list[dict[str, float]]:
    scores = []
    for item in reward_inputs:
        accuracy = accuracy_reward(item["response"], item["ground_truth"])
        overlong = overlong_reward(item["response_length"], max_response_length, overlong_buffer_length)
        scores.append(
            {
                "overall": accuracy + overlong * overlong_penalty_factor,
                "accuracy": accuracy,
                "overlong": overlong,
                "accuracy_normalized": 0.5 * (accuracy + 1.0),
            }
        )
    return scores
