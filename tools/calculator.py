"""A calculator tool for multi-turn rollouts (`worker.rollout.multi_turn.tools: tools/calculator.py`).

A tool file lists its tools in `TOOLS`; each tool is a plain (or async) function whose type hints and Google-style
docstring give the JSON schema the model is shown. The model calls it as
    <tool_call>{"name": "calculator", "arguments": {"expression": "12 * (3 + 4)"}}</tool_call>
and reads the result in a `tool` message. Errors raise: the rollout answers the model with the error and counts it.

The expression is parsed with `ast` and only numbers, + - * / // % ** (small exponents), unary signs and brackets
are evaluated: never `eval`, since the text comes from the model.
"""

import ast
import operator


BINARY = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}
MAX_EXPONENT = 64  # 10**10**10 would hang the tool: exponents stay small
MAX_LENGTH = 200


def _evaluate(node: ast.AST) -> float:
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in BINARY:
        left, right = _evaluate(node.left), _evaluate(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > MAX_EXPONENT:
            raise ValueError(f"exponent {right} is too large (at most {MAX_EXPONENT})")
        return BINARY[type(node.op)](left, right)
    if isinstance(node, ast.UnaryOp) and type(node.op) in UNARY:
        return UNARY[type(node.op)](_evaluate(node.operand))
    raise ValueError(f"unsupported element `{ast.unparse(node)}`: use numbers, + - * / // % ** and brackets")


def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression and return its value.

    Args:
        expression: The expression, with numbers, + - * / // % ** and brackets, e.g. "12 * (3 + 4)".
    """
    if len(expression) > MAX_LENGTH:
        raise ValueError(f"the expression is longer than {MAX_LENGTH} characters")
    value = _evaluate(ast.parse(expression.strip(), mode="eval").body)
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return str(value)


TOOLS = [calculator]


RESULT_BONUS = 0.1  # CalculatorEnv's reward for a trajectory whose last calculation gave the answer


class CalculatorEnv:
    """The calculator as a tool environment, TRL's environment_factory contract
    (`worker.rollout.multi_turn.env: tools/calculator.py:CalculatorEnv`, in place of `tools`). Each trajectory gets
    its own instance: `reset` reads the row's answer column (`answer`, as the built-in arithmetic data names it), the
    `calculator` method is the tool and records each result, and `get_reward` gives RESULT_BONUS when the last result
    is the answer. easyrl adds that to the reward function's overall (TRL sums them), so with
    reward_function/arithmetic.py a right answer checked with the calculator earns a little more than one without."""

    def reset(self, answer=None, **kwargs) -> None:
        self.answer = None if answer is None else str(answer).strip()
        self.results: list[str] = []

    def get_reward(self) -> float:
        return RESULT_BONUS if self.results and self.results[-1] == self.answer else 0.0

    def calculator(self, expression: str) -> str:
        """Evaluate an arithmetic expression and return its value.

        Args:
            expression: The expression, with numbers, + - * / // % ** and brackets, e.g. "12 * (3 + 4)".
        """
        result = calculator(expression)
        self.results.append(result)
        return result
