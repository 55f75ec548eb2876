"""State files need no pickle: what the driver and the workers store besides the DCP shards round-trips through JSON,
and nothing in easyrl unpickles a checkpoint."""

import json
import math
import os
import random
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from easyrl.trainer.checkpoint import (
    CheckpointError,
    CheckpointManager,
    load_dataloader_state,
    load_rng_state,
    save_rng_state,
)
from easyrl.utils.state_file import from_json_value, load_state, save_state, to_json_value


REPO_ROOT = Path(__file__).resolve().parents[1]


def test_every_stored_type_comes_back_equal_and_typed(tmp_path):
    state = {
        "tuple": (3, (1, 2), None),
        "int_keys": {0: "a", 7: [1.5, -2.0]},
        "tensor": torch.arange(6, dtype=torch.uint8).reshape(2, 3),
        "bf16": torch.tensor([1.5, -0.25], dtype=torch.bfloat16),
        "array": np.array([2**32 - 1, 5], dtype=np.uint32),
        "floats": [float("nan"), float("inf"), 0.1],
        "bytes": b"\x00\xff",
        "numpy_scalar": np.float64(2.5),
        "tag_lookalike": {"__tuple__": [1]},
    }
    save_state(str(tmp_path / "s.json"), state)
    back = load_state(str(tmp_path / "s.json"))
    assert back["tuple"] == (3, (1, 2), None) and isinstance(back["tuple"][1], tuple)
    assert back["int_keys"] == {0: "a", 7: [1.5, -2.0]}
    assert back["tensor"].dtype == torch.uint8 and back["tensor"].tolist() == [[0, 1, 2], [3, 4, 5]]
    assert back["bf16"].dtype == torch.bfloat16 and back["bf16"].tolist() == [1.5, -0.25]
    assert back["array"].dtype == np.uint32 and back["array"].tolist() == [4294967295, 5]
    assert math.isnan(back["floats"][0]) and back["floats"][1:] == [math.inf, 0.1]
    assert back["bytes"] == b"\x00\xff" and back["numpy_scalar"] == 2.5
    assert back["tag_lookalike"] == {"__tuple__": [1]}
    json.loads((tmp_path / "s.json").read_text())  # standard JSON (no NaN literal)
    assert "NaN" not in (tmp_path / "s.json").read_text()


def test_an_object_json_cannot_hold_is_refused_naming_where_it_sits():
    with pytest.raises(TypeError, match=r"state\.loader\.sampler: a builtins\.object cannot be stored"):
        to_json_value({"loader": {"sampler": object()}})
    with pytest.raises(TypeError, match="numpy array of Python objects"):
        to_json_value(np.array([object()], dtype=object))


def test_a_crafted_file_only_ever_yields_data():
    # what a pickle would turn into a call is, here, a dict with strange keys
    crafted = {"__reduce__": ["os.system", ["echo pwned"]]}
    assert from_json_value(crafted) == crafted


def test_rng_state_round_trip_is_json(tmp_path):
    random.seed(4), np.random.seed(4), torch.manual_seed(4)
    path = save_rng_state(str(tmp_path / "actor"), rank=1)
    first = (random.random(), np.random.rand(), torch.rand(3))
    load_rng_state(str(tmp_path / "actor"), rank=1)
    again = (random.random(), np.random.rand(), torch.rand(3))
    assert first[:2] == again[:2] and torch.equal(first[2], again[2])
    assert path.endswith("rng_state_rank_1.json")
    json.loads(Path(path).read_text())


def test_a_checkpoint_with_a_pickled_driver_state_is_refused_with_the_reason(tmp_path):
    folder = tmp_path / "global_step_3"
    folder.mkdir()
    torch.save({"dataloader": {}, "epoch": 0, "kl_coef": 0.0}, folder / "driver_state.pt")
    with pytest.raises(CheckpointError, match=r"driver_state\.pt.*a pickle can run code.*Start the run afresh"):
        load_dataloader_state(str(folder))


def test_the_checkpoint_manager_writes_json_driver_files(tmp_path):
    manager = CheckpointManager(str(tmp_path))
    manager.begin(2)
    loader_state = {"_sampler_iter_state": {"samples_yielded": 8}, "_num_yielded": 2, "_shared_seed": None}
    path = manager.commit(2, trainer_state={"epoch": 0, "metrics": {"x": float("nan")}}, dataloader_state=loader_state)
    assert load_dataloader_state(path) == loader_state
    assert sorted(os.listdir(path)) == ["COMPLETE", "dataloader_state.json", "trainer_state.json"]
    assert json.loads((Path(path) / "trainer_state.json").read_text())["global_step"] == 2


def test_no_source_file_loads_a_pickle():
    offenders = []
    for path in sorted((REPO_ROOT / "easyrl").rglob("*.py")):
        text = path.read_text()
        if re.search(r"weights_only\s*=\s*False", text) or re.search(r"\bpickle\.loads?\(", text):
            offenders.append(str(path.relative_to(REPO_ROOT)))
    assert offenders == []


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_dcp_metadata_is_read_without_running_code(tmp_path):
    import pickle

    import torch.distributed.checkpoint as dcp

    from easyrl.workers.fsdp_checkpoint import SafeFileSystemReader

    torch.manual_seed(0)
    saved = {"model": torch.nn.Linear(4, 3).state_dict(), "step": torch.tensor(5, dtype=torch.int64)}
    dcp.save(saved, checkpoint_id=str(tmp_path / "actor"))
    loaded = {"model": {k: torch.zeros_like(v) for k, v in saved["model"].items()}, "step": torch.tensor(0)}
    dcp.load(loaded, storage_reader=SafeFileSystemReader(str(tmp_path / "actor")))
    assert all(torch.equal(loaded["model"][k], saved["model"][k]) for k in saved["model"]) and loaded["step"] == 5

    class Payload:
        def __reduce__(self):
            return (os.mkdir, (str(tmp_path / "pwned"),))

    (tmp_path / "actor" / ".metadata").write_bytes(pickle.dumps(Payload()))
    with pytest.raises(pickle.UnpicklingError, match=r"names `posix\.mkdir`.*refused"):
        SafeFileSystemReader(str(tmp_path / "actor")).read_metadata()
    assert not (tmp_path / "pwned").exists()
