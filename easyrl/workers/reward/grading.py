"""Answer extraction and grading helpers, free for user reward files (the shipped arithmetic reward uses them).

`math_equal` compares math answers with math-verify (symbolic equivalence: 1/2 == 0.5 == \\frac{1}{2}), falling
back to mathruler's normalise-and-sympy grader when math-verify cannot decide. Both graders are imported here, at
the top: a grader that cannot be imported (mathruler's needs `pylatexenc`) fails when the reward file is loaded,
with the missing package named, instead of quietly grading every answer wrong. (The shipped math.py, r1v.py and
dapo.py reproduce EasyR1's scores and grade the way EasyR1's files do, with mathruler alone or DAPO's own rule.)
"""

import re
import threading

from math_verify import parse, verify
from mathruler.grader import grade_answer


def extract_boxed(text: str) -> str | None:
    """Content of the last `\\boxed{...}` (nested braces allowed), or None."""
    start = text.rfind("\\boxed")
    while start != -1:
        brace = start + len("\\boxed")
        while brace < len(text) and text[brace] == " ":
            brace += 1
        if brace < len(text) and text[brace] == "{":
            depth = 0
            for pos in range(brace, len(text)):
                if text[pos] == "{":
                    depth += 1
                elif text[pos] == "}":
                    depth -= 1
                    if depth == 0:
                        return text[brace + 1 : pos].strip()
        start = text.rfind("\\boxed", 0, start)
    return None


def extract_tag(text: str, tag: str = "answer") -> str | None:
    """Content of the last `<tag>...</tag>`, or None."""
    matches = re.findall(rf"<{tag}>(.*?)</{tag}>", text, flags=re.DOTALL)
    return matches[-1].strip() if matches else None


_NUMBER = re.compile(r"^[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?$")


def parse_number(text: str) -> float | None:
    """A plain number (thousands separators, `$`, `%` and surrounding `$...$` tolerated), or None."""
    cleaned = text.strip().strip("$").replace(",", "").replace("\\%", "").rstrip("%").strip()
    cleaned = cleaned.removeprefix("\\$").strip()
    return float(cleaned) if _NUMBER.match(cleaned) else None


def _math_verify_timeout() -> int | None:
    # math-verify's timeout uses signal.alarm, which only works in the main thread
    return 5 if threading.current_thread() is threading.main_thread() else None


def math_equal(prediction: str, ground_truth: str) -> bool:
    """True when `prediction` and `ground_truth` are the same mathematical answer."""
    if prediction is None:
        return False
    prediction, ground_truth = str(prediction).strip(), str(ground_truth).strip()
    if prediction == ground_truth:
        return True
    a, b = parse_number(prediction), parse_number(ground_truth)
    if a is not None and b is not None:
        return abs(a - b) <= 1e-6 * max(1.0, abs(b))
    try:
        timeout = _math_verify_timeout()
        gold = parse(f"\\boxed{{{ground_truth}}}", parsing_timeout=timeout)
        pred = parse(f"\\boxed{{{prediction}}}", parsing_timeout=timeout)
        if gold and pred:
            return bool(verify(gold, pred, timeout_seconds=timeout))
    except Exception:  # noqa: BLE001 - an answer math-verify cannot parse or compare goes to the simpler grader
        pass
    try:
        return bool(grade_answer(prediction, ground_truth))
    except Exception:  # noqa: BLE001 - mathruler raises on some malformed answers: those are not equal
        return False
