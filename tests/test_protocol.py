"""DataProto: every row-wise operation keeps tensors and non-tensors of a sample together."""

import pickle

import numpy as np
import pytest
import torch

from easyrl.protocol import DataProto, pad_dataproto_to_divisor, unpad_dataproto


def make(n: int = 4) -> DataProto:
    return DataProto.from_dict(
        tensors={"x": torch.arange(n * 2).view(n, 2), "y": torch.arange(n).float()},
        non_tensors={"uid": [f"u{i}" for i in range(n)], "ids": [[i] * (i + 1) for i in range(n)]},
        meta_info={"temperature": 1.0},
    )


def test_from_single_dict_splits_tensors_from_the_rest():
    data = DataProto.from_single_dict({"x": torch.zeros(3, 2), "gt": ["a", "b", "c"]})
    assert data.keys() == ["x"]
    assert list(data.non_tensor_batch["gt"]) == ["a", "b", "c"]
    assert len(data) == 3


def test_ragged_lists_stay_one_object_per_row():
    data = make(3)
    assert data.non_tensor_batch["ids"].shape == (3,)
    assert data.non_tensor_batch["ids"][2] == [2, 2, 2]


def test_mismatched_lengths_are_rejected():
    with pytest.raises(ValueError, match="different lengths"):
        DataProto.from_dict({"x": torch.zeros(3)}, {"uid": ["a", "b"]})


def test_getitem_slice_list_and_int():
    data = make(4)
    assert data[1:3].batch["y"].tolist() == [1.0, 2.0]
    picked = data[[3, 0]]
    assert picked.batch["y"].tolist() == [3.0, 0.0]
    assert list(picked.non_tensor_batch["uid"]) == ["u3", "u0"]
    item = data[2]
    assert item.non_tensor_batch["uid"] == "u2" and item.batch["y"].item() == 2.0


def test_select_and_pop():
    data = make(4)
    only_x = data.select(batch_keys=["x"], non_tensor_batch_keys=["uid"])
    assert only_x.keys() == ["x"] and list(only_x.non_tensor_batch) == ["uid"]
    popped = data.pop(batch_keys=["y"], non_tensor_batch_keys=["ids"])
    assert popped.keys() == ["y"] and data.keys() == ["x"]
    assert "ids" not in data.non_tensor_batch and popped.non_tensor_batch["ids"][1] == [1, 1]


def test_union_merges_and_rejects_conflicts():
    data = make(4)
    extra = DataProto.from_dict({"z": torch.ones(4)}, {"score": [1, 2, 3, 4]}, {"step": 3})
    merged = data.union(extra)
    assert set(merged.keys()) == {"x", "y", "z"} and merged.meta_info["step"] == 3
    clash = DataProto.from_dict({"y": torch.zeros(4)})
    with pytest.raises(ValueError, match="`y` differs"):
        make(4).union(clash)


def test_chunk_split_concat_round_trip():
    data = make(6)
    parts = data.chunk(3)
    assert [len(p) for p in parts] == [2, 2, 2]
    assert [len(p) for p in data.split(4)] == [4, 2]
    joined = DataProto.concat(parts)
    assert torch.equal(joined.batch["x"], data.batch["x"])
    assert list(joined.non_tensor_batch["uid"]) == list(data.non_tensor_batch["uid"])
    with pytest.raises(ValueError, match="cannot be cut into 4"):
        data.chunk(4)


def test_concat_keeps_a_key_that_only_some_parts_hold():
    # a text-only mini-batch from a dataset mixing text and pictures has no multi_modal_data; its rows get None
    text = make(2)
    pictures = make(3)
    pictures.non_tensor_batch["multi_modal_data"] = np.array([{"images": [i]} for i in range(3)], dtype=object)
    for parts, expected in (
        ([text, pictures], [None, None, {"images": [0]}, {"images": [1]}, {"images": [2]}]),
        ([pictures, text], [{"images": [0]}, {"images": [1]}, {"images": [2]}, None, None]),
    ):
        joined = DataProto.concat(parts)
        assert list(joined.non_tensor_batch["multi_modal_data"]) == expected
        assert len(joined.non_tensor_batch["uid"]) == 5
    with pytest.raises(ValueError, match="different tensors"):
        DataProto.concat([make(2), make(2).select(batch_keys=["x"], non_tensor_batch_keys=["uid", "ids"])])


def test_pad_to_divisor_and_unpad():
    data = make(5)
    padded, pad_size = pad_dataproto_to_divisor(data, 4)
    assert (len(padded), pad_size) == (8, 3)
    assert list(padded.non_tensor_batch["uid"][5:]) == ["u0", "u1", "u2"]  # padding repeats the first rows
    restored = unpad_dataproto(padded, pad_size)
    assert torch.equal(restored.batch["x"], data.batch["x"])


def test_repeat_interleaved_and_tiled():
    data = make(2)
    assert list(data.repeat(3).non_tensor_batch["uid"]) == ["u0", "u0", "u0", "u1", "u1", "u1"]
    assert data.repeat(2, interleave=False).batch["y"].tolist() == [0.0, 1.0, 0.0, 1.0]


def test_reorder_in_place():
    data = make(3)
    data.reorder(torch.tensor([2, 0, 1]))
    assert data.batch["y"].tolist() == [2.0, 0.0, 1.0]
    assert list(data.non_tensor_batch["uid"]) == ["u2", "u0", "u1"]


def test_pickle_round_trip_keeps_everything():
    data = make(3)
    data.non_tensor_batch["img"] = np.array([None, {"a": 1}, None], dtype=object)
    restored = pickle.loads(pickle.dumps(data))
    assert torch.equal(restored.batch["x"], data.batch["x"])
    assert restored.non_tensor_batch["img"][1] == {"a": 1}
    assert restored.meta_info == {"temperature": 1.0}


@pytest.mark.timeout(120)
def test_ray_transfer_round_trip(ray_cluster):
    data = make(4)
    restored = ray_cluster.get(ray_cluster.put(data))
    assert torch.equal(restored.batch["x"], data.batch["x"])
    assert restored.non_tensor_batch["ids"][3] == [3, 3, 3, 3]


def test_select_of_a_missing_key_names_it():
    with pytest.raises(KeyError, match=r"no tensor key\(s\) \['nope'\]"):
        make(2).select(batch_keys=["nope"])
    with pytest.raises(KeyError, match=r"no non-tensor key\(s\) \['nope'\]"):
        make(2).pop(non_tensor_batch_keys=["nope"])


def test_boolean_mask_keeps_the_marked_rows():
    picked = make(4)[np.array([True, False, False, True])]
    assert list(picked.non_tensor_batch["uid"]) == ["u0", "u3"]
    assert picked.batch["y"].tolist() == [0.0, 3.0]


def test_union_accepts_equal_overlap_and_rejects_meta_conflict():
    data = make(3)
    same = data.select(batch_keys=["x"], non_tensor_batch_keys=["ids"])  # equal lists of token ids overlap
    assert set(data.union(same).keys()) == {"x", "y"}
    with pytest.raises(ValueError, match="meta_info `temperature` differs"):
        make(3).union(DataProto(meta_info={"temperature": 0.5}))
    with pytest.raises(ValueError, match="lengths 3 and 2"):
        make(3).union(make(2))


def test_padding_needs_a_positive_divisor():
    with pytest.raises(ValueError, match="divisor must be positive"):
        pad_dataproto_to_divisor(make(2), 0)


def test_repeat_then_chunk_keeps_each_prompt_with_its_samples():
    data = make(2).repeat(2)  # u0 u0 u1 u1
    first, second = data.chunk(2)
    assert list(first.non_tensor_batch["uid"]) == ["u0", "u0"]
    assert second.batch["x"].tolist() == [[2, 3], [2, 3]]
