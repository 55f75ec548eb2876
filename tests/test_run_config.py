"""The resolved config kept in a run's folder (easyrl/trainer/run_config.py)."""

import logging

import yaml

from easyrl.config import config_to_yaml, load_run_plan
from easyrl.trainer.run_config import record_run_config


def _config_yaml(*overrides: str) -> str:
    return config_to_yaml(load_run_plan(["config=examples/smollm2_arithmetic_grpo.yaml", *overrides]).config)


def test_each_start_keeps_its_config_and_a_changed_one_names_its_keys(tmp_path, caplog):
    run = tmp_path / "run"
    first = _config_yaml("trainer.max_steps=4")
    with caplog.at_level(logging.WARNING):
        assert record_run_config(str(run), first) == []
        assert record_run_config(str(run), first) == []  # a resume with the same settings: nothing to say
    assert (run / "config.yaml").read_text() == first
    assert yaml.safe_load(first)["trainer"]["max_steps"] == 4
    assert not caplog.text and sorted(p.name for p in run.iterdir()) == ["config.yaml"]

    second = _config_yaml("trainer.max_steps=8", "worker.rollout.n=2")
    with caplog.at_level(logging.WARNING):
        changes = record_run_config(str(run), second)
    assert changes == ["trainer.max_steps: 4 -> 8", "worker.rollout.n: 6 -> 2"]
    assert (run / "config.yaml").read_text() == second and (run / "config.1.yaml").read_text() == first
    assert (
        f"This run's config differs from the one the last run in {run} ran with (kept as config.1.yaml) in 2 key(s): "
        "trainer.max_steps: 4 -> 8; worker.rollout.n: 6 -> 2." in caplog.text
    )
    # a third start with other settings again keeps the second's as config.2.yaml
    third = _config_yaml("trainer.max_steps=8", "worker.rollout.n=2", "worker.actor.optim.lr=3e-5")
    assert record_run_config(str(run), third) == ["worker.actor.optim.lr: 2e-05 -> 3e-05"]
    assert (run / "config.2.yaml").read_text() == second
