"""Small state files (dataloader position, RNG states, lr scheduler, counters) as JSON, with nothing to unpickle.

Unpickling (``torch.load`` with ``weights_only`` off) runs whatever code a pickle names, so a checkpoint shared by
someone else could run code on load. These files are plain JSON instead: Python containers, numbers and strings as they are, and the
few values JSON has no type for written as tagged objects: tuples ``{"__tuple__": [...]}``, dicts whose keys are not
all strings ``{"__items__": [[key, value], ...]}``, bytes ``{"__bytes__": base64}``, and torch tensors / numpy
arrays ``{"__tensor__" | "__ndarray__": {"dtype", "shape", "data": base64 of the raw little-endian bytes}}``.
Loading rebuilds exactly those types and nothing else; anything else is refused on save, naming where it sits.
"""

import base64
import json
import math
import sys
from typing import Any

import numpy as np
import torch

from .files import replace_file


_TAGS = ("__tuple__", "__items__", "__bytes__", "__tensor__", "__ndarray__", "__float__")


def _array_payload(array: np.ndarray) -> dict:
    array = np.ascontiguousarray(array)
    if array.dtype.byteorder == ">" or (array.dtype.byteorder == "=" and sys.byteorder == "big"):
        array = array.astype(array.dtype.newbyteorder("<"))
    return {"dtype": array.dtype.str, "shape": list(array.shape), "data": base64.b64encode(array.tobytes()).decode()}


def _array_from_payload(payload: dict) -> np.ndarray:
    raw = base64.b64decode(payload["data"])
    return np.frombuffer(raw, dtype=np.dtype(payload["dtype"])).reshape(payload["shape"]).copy()


def to_json_value(value: Any, where: str = "state") -> Any:
    """``value`` as something ``json.dumps`` writes and ``from_json_value`` turns back into an equal value."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        # json writes NaN/Infinity, which other readers refuse: keep the file standard JSON
        return value if math.isfinite(value) else {"__float__": repr(value)}
    if isinstance(value, np.generic):
        return to_json_value(value.item(), where)
    if isinstance(value, (list, tuple)):
        items = [to_json_value(item, f"{where}[{i}]") for i, item in enumerate(value)]
        return {"__tuple__": items} if isinstance(value, tuple) else items
    if isinstance(value, dict):
        if all(isinstance(key, str) for key in value) and not (len(value) == 1 and next(iter(value)) in _TAGS):
            return {key: to_json_value(item, f"{where}.{key}") for key, item in value.items()}
        return {"__items__": [[to_json_value(k, where), to_json_value(v, f"{where}.{k}")] for k, v in value.items()]}
    if isinstance(value, bytes):
        return {"__bytes__": base64.b64encode(value).decode()}
    if isinstance(value, torch.Tensor):
        tensor = value.detach().cpu()
        if tensor.dtype == torch.bfloat16:  # numpy has no bfloat16: its bits travel as int16
            payload = _array_payload(tensor.view(torch.int16).numpy())
            payload["torch_dtype"] = "bfloat16"
        else:
            payload = _array_payload(tensor.numpy())
        return {"__tensor__": payload}
    if isinstance(value, np.ndarray):
        if value.dtype == object:
            raise TypeError(f"{where}: a numpy array of Python objects cannot be stored without pickle.")
        return {"__ndarray__": _array_payload(value)}
    raise TypeError(
        f"{where}: a {type(value).__module__}.{type(value).__qualname__} cannot be stored in a state file (JSON "
        "containers, numbers, strings, bytes, tensors and numpy arrays only)."
    )


def from_json_value(value: Any) -> Any:
    """The inverse of ``to_json_value``."""
    if isinstance(value, list):
        return [from_json_value(item) for item in value]
    if not isinstance(value, dict):
        return value
    if len(value) == 1:
        (tag, payload), *_ = value.items()
        if tag == "__tuple__":
            return tuple(from_json_value(item) for item in payload)
        if tag == "__items__":
            return {from_json_value(k): from_json_value(v) for k, v in payload}
        if tag == "__bytes__":
            return base64.b64decode(payload)
        if tag == "__float__":
            return float(payload)
        if tag == "__ndarray__":
            return _array_from_payload(payload)
        if tag == "__tensor__":
            tensor = torch.from_numpy(_array_from_payload(payload))
            return tensor.view(torch.bfloat16) if payload.get("torch_dtype") == "bfloat16" else tensor
    return {key: from_json_value(item) for key, item in value.items()}


def save_state(path: str, state: Any) -> None:
    """Write ``state`` to ``path`` (JSON) durably: a temporary file, fsync, then a rename over ``path``."""
    replace_file(path, json.dumps(to_json_value(state), indent=1, allow_nan=False))


def load_state(path: str) -> Any:
    """Read a file written by ``save_state``; no code runs, whoever wrote the file."""
    with open(path, encoding="utf-8") as handle:
        return from_json_value(json.load(handle))
