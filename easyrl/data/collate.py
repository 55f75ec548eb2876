"""Batching dataset items into a DataProto: tensors stacked, everything else kept per sample in object arrays; SFT
conversations laid out as the actor's prompt + response batch."""

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


def sft_collate(items: list[dict[str, Any]], pad_token_id: int) -> DataProto:
    """SFT items -> the actor's batch: ``input_ids`` / ``attention_mask`` / ``position_ids`` (batch, P + R) with the
    part before each row's first labelled token left-padded to P and the rest right-padded to R, ``responses`` and
    ``response_mask`` (batch, R) (the loss mask), and ``multi_modal_data`` when the items have it."""
    starts = [int(torch.nonzero(item["loss_mask"]).flatten()[0]) for item in items]
    prompt_len = max(starts)
    response_len = max(len(item["input_ids"]) - start for item, start in zip(items, starts))
    batch = len(items)
    multi_axis = items[0]["position_ids"].dim() == 2
    input_ids = torch.full((batch, prompt_len + response_len), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros_like(input_ids)
    loss_mask = torch.zeros_like(input_ids)
    position_ids = torch.zeros(
        (batch, 3, prompt_len + response_len) if multi_axis else input_ids.shape, dtype=torch.long
    )
    for row, (item, start) in enumerate(zip(items, starts)):
        length = len(item["input_ids"])
        # tokens [0, start) end at column prompt_len; tokens [start, length) begin there
        columns = slice(prompt_len - start, prompt_len - start + length)
        input_ids[row, columns] = item["input_ids"]
        attention_mask[row, columns] = 1
        loss_mask[row, columns] = item["loss_mask"]
        position_ids[row, ..., columns] = item["position_ids"]
    tensors = {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "position_ids": position_ids,
        "responses": input_ids[:, prompt_len:],
        "response_mask": loss_mask[:, prompt_len:],
    }
    non_tensors = {}
    if any("multi_modal_data" in item for item in items):
        non_tensors["multi_modal_data"] = as_object_array([item.get("multi_modal_data") for item in items])
    return DataProto.from_dict(tensors=tensors, non_tensors=non_tensors)
