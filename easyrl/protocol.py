"""DataProto: the one batch type that flows between the driver and the workers.

A DataProto holds
- ``batch``: a ``TensorDict`` of tensors that share dimension 0 (input_ids, responses, log-probs, ...),
- ``non_tensor_batch``: numpy object arrays of the same length (raw prompt ids, images, ground truth, uids, ...),
- ``meta_info``: a free-form dict (temperature, metrics, flags) that describes the batch as a whole.

Every row-wise operation (select rows, split, concat, repeat, reorder) applies to tensors and non-tensors alike,
so a sample's images and ground truth always travel with its tokens.
"""

import copy
import pickle
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Optional, Union

import numpy as np
import torch
from tensordict import TensorDict


__all__ = ["DataProto", "DataProtoItem", "as_object_array", "pad_dataproto_to_divisor", "unpad_dataproto"]

Index = Union[slice, int, Sequence[int], np.ndarray, torch.Tensor]


def _require_keys(kind: str, wanted: Iterable[str], present: Iterable[str]) -> None:
    present = list(present)
    missing = [k for k in wanted if k not in present]
    if missing:
        raise KeyError(f"DataProto has no {kind} key(s) {missing}; it has {sorted(present)}.")


def as_object_array(values: Any) -> np.ndarray:
    """A 1-D numpy object array whose i-th element is values[i] (lists stay lists, never broadcast).

    ``np.array(list_of_equal_length_lists, dtype=object)`` would build a 2-D array; this never does.
    """
    if isinstance(values, np.ndarray) and values.dtype == object and values.ndim == 1:
        return values
    out = np.empty(len(values), dtype=object)
    for i, value in enumerate(values):
        out[i] = value
    return out


def _index_array(item: Index, length: int) -> np.ndarray:
    if isinstance(item, slice):
        return np.arange(length)[item]
    if isinstance(item, torch.Tensor):
        item = item.cpu().numpy()
    indices = np.asarray(item)
    if indices.dtype == bool:
        indices = np.nonzero(indices)[0]
    return indices.astype(np.int64)


@dataclass
class DataProtoItem:
    """One row of a DataProto."""

    batch: Optional[TensorDict]
    non_tensor_batch: dict[str, Any]
    meta_info: dict[str, Any]


@dataclass
class DataProto:
    batch: Optional[TensorDict] = None
    non_tensor_batch: dict[str, np.ndarray] = field(default_factory=dict)
    meta_info: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.non_tensor_batch = {k: as_object_array(v) for k, v in self.non_tensor_batch.items()}
        self._check_lengths()

    def _check_lengths(self) -> None:
        lengths = {len(v) for v in self.non_tensor_batch.values()}
        if self.batch is not None:
            lengths.add(self.batch.batch_size[0] if self.batch.batch_size else 0)
        if len(lengths) > 1:
            sizes = {k: len(v) for k, v in self.non_tensor_batch.items()}
            if self.batch is not None:
                sizes["<tensors>"] = self.batch.batch_size[0]
            raise ValueError(f"DataProto fields have different lengths: {sizes}.")

    # ------------------------------------------------------------------------------------------------------------------
    # construction
    # ------------------------------------------------------------------------------------------------------------------
    @classmethod
    def from_dict(
        cls,
        tensors: Optional[dict[str, torch.Tensor]] = None,
        non_tensors: Optional[dict[str, Any]] = None,
        meta_info: Optional[dict[str, Any]] = None,
    ) -> "DataProto":
        batch = None
        if tensors:
            sizes = {k: v.shape[0] for k, v in tensors.items()}
            if len(set(sizes.values())) != 1:
                raise ValueError(f"Tensors of a DataProto must share dimension 0, got {sizes}.")
            batch = TensorDict(dict(tensors), batch_size=[next(iter(sizes.values()))])
        return cls(batch=batch, non_tensor_batch=dict(non_tensors or {}), meta_info=dict(meta_info or {}))

    @classmethod
    def from_single_dict(cls, data: dict[str, Any], meta_info: Optional[dict[str, Any]] = None) -> "DataProto":
        """Split a dict into tensors (torch.Tensor values) and non-tensors (everything else)."""
        tensors = {k: v for k, v in data.items() if isinstance(v, torch.Tensor)}
        non_tensors = {k: v for k, v in data.items() if not isinstance(v, torch.Tensor)}
        return cls.from_dict(tensors, non_tensors, meta_info)

    # ------------------------------------------------------------------------------------------------------------------
    # size and indexing
    # ------------------------------------------------------------------------------------------------------------------
    def __len__(self) -> int:
        if self.batch is not None and self.batch.batch_size:
            return int(self.batch.batch_size[0])
        if self.non_tensor_batch:
            return len(next(iter(self.non_tensor_batch.values())))
        return 0

    def __getitem__(self, item: Index) -> Union["DataProto", DataProtoItem]:
        if isinstance(item, (int, np.integer)):
            return DataProtoItem(
                batch=self.batch[int(item)] if self.batch is not None else None,
                non_tensor_batch={k: v[int(item)] for k, v in self.non_tensor_batch.items()},
                meta_info=self.meta_info,
            )
        return self.select_rows(_index_array(item, len(self)))

    def select_rows(self, indices: np.ndarray) -> "DataProto":
        """The rows at ``indices`` (in that order), as a new DataProto sharing meta_info."""
        indices = np.asarray(indices, dtype=np.int64)
        batch = self.batch[torch.from_numpy(indices)] if self.batch is not None else None
        non_tensors = {k: v[indices] for k, v in self.non_tensor_batch.items()}
        return DataProto(batch=batch, non_tensor_batch=non_tensors, meta_info=self.meta_info)

    def keys(self) -> list[str]:
        return list(self.batch.keys()) if self.batch is not None else []

    # ------------------------------------------------------------------------------------------------------------------
    # keys
    # ------------------------------------------------------------------------------------------------------------------
    def select(
        self,
        batch_keys: Optional[Iterable[str]] = None,
        non_tensor_batch_keys: Optional[Iterable[str]] = None,
        meta_info_keys: Optional[Iterable[str]] = None,
        deepcopy: bool = False,
    ) -> "DataProto":
        """A DataProto with only the named keys (None keeps all of that kind)."""
        batch = self.batch
        if batch is not None and batch_keys is not None:
            batch_keys = list(batch_keys)
            _require_keys("tensor", batch_keys, batch.keys())
            batch = batch.select(*batch_keys)
        non_tensors = self.non_tensor_batch
        if non_tensor_batch_keys is not None:
            non_tensor_batch_keys = list(non_tensor_batch_keys)
            _require_keys("non-tensor", non_tensor_batch_keys, non_tensors)
            non_tensors = {k: non_tensors[k] for k in non_tensor_batch_keys}
        else:
            non_tensors = dict(non_tensors)
        meta = self.meta_info
        if meta_info_keys is not None:
            meta_info_keys = list(meta_info_keys)
            _require_keys("meta_info", meta_info_keys, meta)
            meta = {k: meta[k] for k in meta_info_keys}
        else:
            meta = dict(meta)
        out = DataProto(batch=batch, non_tensor_batch=non_tensors, meta_info=meta)
        return copy.deepcopy(out) if deepcopy else out

    def pop(
        self,
        batch_keys: Iterable[str] = (),
        non_tensor_batch_keys: Iterable[str] = (),
        meta_info_keys: Iterable[str] = (),
    ) -> "DataProto":
        """Remove the named keys from this DataProto and return them as a new one."""
        batch_keys, non_tensor_batch_keys, meta_info_keys = (
            list(batch_keys),
            list(non_tensor_batch_keys),
            list(meta_info_keys),
        )
        _require_keys("tensor", batch_keys, self.keys())
        _require_keys("non-tensor", non_tensor_batch_keys, self.non_tensor_batch)
        _require_keys("meta_info", meta_info_keys, self.meta_info)
        tensors = {k: self.batch.pop(k) for k in batch_keys} if self.batch is not None else {}
        non_tensors = {k: self.non_tensor_batch.pop(k) for k in non_tensor_batch_keys}
        meta = {k: self.meta_info.pop(k) for k in meta_info_keys}
        return DataProto.from_dict(tensors, non_tensors, meta)

    def union(self, other: "DataProto") -> "DataProto":
        """Merge ``other``'s keys into this DataProto (in place, also returned); shared keys must be equal."""
        if len(self) and len(other) and len(self) != len(other):
            raise ValueError(f"Cannot union DataProtos of lengths {len(self)} and {len(other)}.")
        if other.batch is not None:
            if self.batch is None:
                self.batch = other.batch
            else:
                for key in other.batch.keys():
                    value = other.batch[key]
                    if key in self.batch.keys():
                        if not torch.equal(self.batch[key], value):
                            raise ValueError(f"union: tensor `{key}` differs between the two DataProtos.")
                    else:
                        self.batch[key] = value
        for key, value in other.non_tensor_batch.items():
            if key in self.non_tensor_batch:
                mine = self.non_tensor_batch[key]
                if len(mine) != len(value) or any(not _equal(a, b) for a, b in zip(mine, value)):
                    raise ValueError(f"union: non-tensor `{key}` differs between the two DataProtos.")
            else:
                self.non_tensor_batch[key] = value
        for key, value in other.meta_info.items():
            if key in self.meta_info and not _equal(self.meta_info[key], value):
                raise ValueError(f"union: meta_info `{key}` differs between the two DataProtos.")
            self.meta_info[key] = value
        self._check_lengths()
        return self

    # ------------------------------------------------------------------------------------------------------------------
    # row-wise operations
    # ------------------------------------------------------------------------------------------------------------------
    def chunk(self, chunks: int) -> list["DataProto"]:
        """``chunks`` equal parts in order; the length must divide evenly (pad first with pad_dataproto_to_divisor)."""
        if len(self) % chunks != 0:
            raise ValueError(f"DataProto of length {len(self)} cannot be cut into {chunks} equal chunks.")
        return self.split(len(self) // chunks) if len(self) else [self.select_rows(np.arange(0))] * chunks

    def split(self, split_size: int) -> list["DataProto"]:
        """Consecutive parts of ``split_size`` rows (the last may be shorter)."""
        if split_size <= 0:
            raise ValueError(f"split_size must be positive, got {split_size}.")
        return [
            self.select_rows(np.arange(i, min(i + split_size, len(self)))) for i in range(0, len(self), split_size)
        ]

    @staticmethod
    def concat(data: list["DataProto"]) -> "DataProto":
        """Rows of all parts, in order; meta_info of the first part. A non-tensor key missing from some parts is None
        for their rows (as ``collate_fn`` does within a batch: a batch of text rows from a dataset mixing text and
        pictures has no ``multi_modal_data``); tensor keys must be the same in every part."""
        if not data:
            raise ValueError("DataProto.concat needs at least one DataProto.")
        tensor_keys = [None if d.batch is None else set(d.batch.keys()) for d in data]
        if any(keys != tensor_keys[0] for keys in tensor_keys):
            raise ValueError(f"DataProto.concat: the parts hold different tensors: {tensor_keys}.")
        batch = torch.cat([d.batch for d in data], dim=0) if tensor_keys[0] is not None else None
        keys = dict.fromkeys(key for d in data for key in d.non_tensor_batch)
        non_tensors = {
            key: np.concatenate(
                [
                    d.non_tensor_batch[key] if key in d.non_tensor_batch else as_object_array([None] * len(d))
                    for d in data
                ]
            )
            for key in keys
        }
        return DataProto(batch=batch, non_tensor_batch=non_tensors, meta_info=dict(data[0].meta_info))

    def repeat(self, repeat_times: int, interleave: bool = True) -> "DataProto":
        """Each row ``repeat_times`` times: a a b b (interleave) or a b a b."""
        if interleave:
            indices = np.repeat(np.arange(len(self)), repeat_times)
        else:
            indices = np.tile(np.arange(len(self)), repeat_times)
        return self.select_rows(indices)

    def reorder(self, indices: torch.Tensor) -> None:
        """Put the rows in the order given by ``indices`` (in place)."""
        reordered = self.select_rows(_index_array(indices, len(self)))
        self.batch, self.non_tensor_batch = reordered.batch, reordered.non_tensor_batch

    def to(self, device: Union[str, torch.device]) -> "DataProto":
        if self.batch is not None:
            self.batch = self.batch.to(device)
        return self

    # ------------------------------------------------------------------------------------------------------------------
    # transfer: tensors as plain dicts of contiguous tensors, which pickle (and Ray) move cheaply
    # ------------------------------------------------------------------------------------------------------------------
    def __getstate__(self) -> dict[str, Any]:
        tensors = None
        if self.batch is not None:
            tensors = {k: v.contiguous() for k, v in self.batch.items()}
            tensors = (tensors, list(self.batch.batch_size))
        return {"tensors": tensors, "non_tensor_batch": self.non_tensor_batch, "meta_info": self.meta_info}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.batch = None
        if state["tensors"] is not None:
            tensors, batch_size = state["tensors"]
            self.batch = TensorDict(tensors, batch_size=batch_size)
        self.non_tensor_batch = state["non_tensor_batch"]
        self.meta_info = state["meta_info"]

    def __repr__(self) -> str:
        # the dataclass repr would print every tensor and image; shapes and key names are what one wants to see
        tensors = {k: tuple(v.shape) for k, v in self.batch.items()} if self.batch is not None else {}
        return (
            f"DataProto(len={len(self)}, tensors={tensors}, non_tensors={sorted(self.non_tensor_batch)}, "
            f"meta_info={sorted(self.meta_info)})"
        )

    def to_bytes(self) -> bytes:
        return pickle.dumps(self, protocol=pickle.HIGHEST_PROTOCOL)


def _equal(a: Any, b: Any) -> bool:
    """Equality for union's overlap check; copes with tensors, arrays and dicts/lists holding them."""
    if a is b:
        return True
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        a, b = np.asarray(a, dtype=object), np.asarray(b, dtype=object)
        return a.shape == b.shape and all(_equal(x, y) for x, y in zip(a.ravel(), b.ravel()))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b))
    try:
        return bool(a == b)
    except (ValueError, TypeError, RuntimeError):
        return False


def pad_dataproto_to_divisor(data: DataProto, divisor: int) -> tuple[DataProto, int]:
    """Append copies of the first rows until the length is a multiple of ``divisor``; return (padded, pad_size)."""
    if divisor <= 0:
        raise ValueError(f"divisor must be positive, got {divisor}.")
    pad_size = (-len(data)) % divisor
    if pad_size == 0:
        return data, 0
    indices = np.concatenate([np.arange(len(data)), np.arange(pad_size) % len(data)])
    return data.select_rows(indices), pad_size


def unpad_dataproto(data: DataProto, pad_size: int) -> DataProto:
    """Drop the ``pad_size`` rows pad_dataproto_to_divisor appended."""
    return data.select_rows(np.arange(len(data) - pad_size)) if pad_size else data
