"""Batching dataset items into a DataProto: tensors stacked, everything else kept per sample in object arrays."""

from typing import Any

import torch

from ..protocol import DataProto, as_object_array


def collate_fn(items: list[dict[str, Any]]) -> DataProto:
    """``items`` (dicts of one sample each) -> DataProto. A key missing from some items (e.g. multi_modal_data in a
    dataset mixing text and image rows) is None for those samples."""
    keys = list(dict.fromkeys(key for item in items for key in item))
    tensors, non_tensors = {}, {}
    for key in keys:
        values = [item.get(key) for item in items]
        if all(isinstance(value, torch.Tensor) for value in values):
            tensors[key] = torch.stack(values)  # (batch, ...)
        else:
            non_tensors[key] = as_object_array(values)
    return DataProto.from_dict(tensors=tensors, non_tensors=non_tensors)
