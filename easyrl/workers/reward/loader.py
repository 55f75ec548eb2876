"""Loading a reward function from a user `.py` file (EasyR1-compatible).

`worker.reward.reward_function` is `path/to/file.py:function` (the function defaults to `compute_score`). The
module's `REWARD_TYPE` says how the function is called:
    "batch" (default)  fn(reward_inputs: list[dict], **kwargs) -> list[dict]
    "sequential"       fn(reward_input: dict, **kwargs) -> dict
Each input dict holds `response` (decoded text), `response_length` (tokens) and `ground_truth`; each output dict
holds `overall` (float) and optionally more named scores (`format`, `accuracy`, ...), which become metrics.
`worker.reward.reward_function_kwargs` are passed as keyword arguments.
"""

import hashlib
import importlib.util
import inspect
import numbers
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


DEFAULT_FUNCTION = "compute_score"
REWARD_TYPES = ("batch", "sequential")
CONFIG_KEY = "worker.reward.reward_function"


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

    @property
    def where(self) -> str:
        return f"`{self.name}` in {self.path}"

    def score(self, inputs: list[dict]) -> list[dict[str, float]]:
        """One score dict per input, checked and converted to floats. Exceptions of the function propagate."""
        if self.reward_type == "batch":
            outputs = self.fn(inputs, **self.kwargs)
            if not isinstance(outputs, (list, tuple)) or len(outputs) != len(inputs):
                got = type(outputs).__name__ + (f" of length {len(outputs)}" if hasattr(outputs, "__len__") else "")
                raise RewardFunctionError(
                    f"Reward function {self.where} (REWARD_TYPE='batch') must return a list of {len(inputs)} dicts, "
                    f"one per input; it returned a {got}."
                )
        else:
            outputs = [self.fn(item, **self.kwargs) for item in inputs]
        return [self._check(output) for output in outputs]

    def _check(self, output: Any) -> dict[str, float]:
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
                    checked[str(key)] = float(value)
                except (TypeError, ValueError):
                    raise RewardFunctionError(
                        f"Reward function {self.where} returned a non-numeric score `{key}`: {value!r}. "
                        "Every score must be a number."
                    ) from None
            return checked
        raise RewardFunctionError(
            f"Reward function {self.where} must return a dict with at least an `overall` float per response; {hint}."
        )


def parse_spec(spec: str) -> tuple[str, str]:
    """`path.py:fn` -> (path, fn); `path.py` -> (path, compute_score)."""
    if not spec:
        raise RewardFunctionError(f"`{CONFIG_KEY}` is empty; give a reward module as path/to/file.py:function.")
    path, sep, name = spec.rpartition(":")
    if not sep or not name.isidentifier():
        return spec, DEFAULT_FUNCTION
    return path, name


def _import_file(path: Path):
    # a unique module name: the shipped `math.py` must not shadow the standard library's `math` in sys.modules
    digest = hashlib.sha1(str(path).encode()).hexdigest()[:10]
    module_name = f"easyrl_reward_{path.stem}_{digest}"
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise RewardFunctionError(f"`{CONFIG_KEY}`: cannot import `{path}` as a Python module.")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as err:
        sys.modules.pop(module_name, None)
        raise RewardFunctionError(
            f"`{CONFIG_KEY}`: importing `{path}` failed with {type(err).__name__}: {err}"
        ) from err
    return module


def load_reward_function(spec: str, kwargs: dict | None = None) -> RewardFunction:
    """Import `path.py:fn`, read REWARD_TYPE, and check that `fn` accepts `kwargs`."""
    path_text, name = parse_spec(spec)
    path = Path(path_text).expanduser().resolve()
    if not path.is_file():
        raise RewardFunctionError(
            f"`{CONFIG_KEY}`: reward file `{path_text}` does not exist. Give it as path/to/file.py:function, "
            "e.g. reward_function/math.py:compute_score."
        )
    module = _import_file(path)
    fn = getattr(module, name, None)
    if fn is None:
        functions = sorted(n for n, obj in vars(module).items() if inspect.isfunction(obj) and not n.startswith("_"))
        raise RewardFunctionError(
            f"`{CONFIG_KEY}`: `{path_text}` defines no function `{name}`. "
            f"Functions found: {', '.join(functions) or 'none'}."
        )
    if not callable(fn):
        raise RewardFunctionError(f"`{CONFIG_KEY}`: `{name}` in `{path_text}` is not a function.")
    reward_type = getattr(module, "REWARD_TYPE", "batch")
    if reward_type not in REWARD_TYPES:
        raise RewardFunctionError(
            f"`REWARD_TYPE` in `{path_text}` is {reward_type!r}; use 'batch' (the function takes and returns lists) "
            "or 'sequential' (one dict in, one dict out)."
        )
    kwargs = dict(kwargs or {})
    try:
        inspect.signature(fn).bind(None, **kwargs)
    except TypeError as err:
        raise RewardFunctionError(
            f"Reward function `{name}` in `{path_text}` cannot be called with one input and the keyword arguments "
            f"{sorted(kwargs)} from `worker.reward.reward_function_kwargs`: {err}."
        ) from None
    except ValueError:
        pass  # builtins without a signature: trust them
    return RewardFunction(fn=fn, reward_type=reward_type, path=str(path), name=name, kwargs=kwargs)
