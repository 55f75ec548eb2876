"""`easyrl check` holds every numeric key to its range and finds unreadable model and data paths before Ray: each
error names the key, the value and what is allowed. No torch, no network (the hub probe runs in the driver)."""

import dataclasses
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from easyrl.config import ConfigError, PPOConfig, load_run_plan, validate
from easyrl.config.validate import RANGES, SAMPLING_OVERRIDE_KEYS, check_model_sources


ROOT = Path(__file__).resolve().parent.parent
HUB_ID = "no-such-org/no-such-model"


@pytest.fixture
def no_hub_settings(monkeypatch, tmp_path):
    """No offline flag, no proxy, an empty hub cache: what each test sets is all there is."""
    for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_ENDPOINT", "HF_HOME", "HUGGINGFACE_HUB_CACHE"):
        monkeypatch.delenv(name, raising=False)
    for name in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub_cache"))


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("worker.actor.optim.lr=-1e-6", "`worker.actor.optim.lr` is -1e-06; it must be > 0 (the optimizer would"),
        ("worker.actor.optim.lr=0", "`worker.actor.optim.lr` is 0.0; it must be > 0"),
        ("worker.actor.optim.lr=.inf", "`worker.actor.optim.lr` is inf; it must be > 0"),
        ("worker.critic.optim.lr=-1", "`worker.critic.optim.lr` is -1.0; it must be > 0"),
        ("worker.actor.optim.weight_decay=-0.01", "`worker.actor.optim.weight_decay` is -0.01; it must be >= 0."),
        (
            "worker.actor.optim.lr_warmup_ratio=1.5",
            "`worker.actor.optim.lr_warmup_ratio` is 1.5; it must be in [0, 1]",
        ),
        ("worker.actor.optim.betas=[0.9,1.0]", "`worker.actor.optim.betas[1]` is 1.0; it must be in [0, 1)."),
        ("worker.actor.optim.betas=[0.9]", "`worker.actor.optim.betas` is [0.9]; give two numbers"),
        ("worker.actor.clip_ratio_low=-0.2", "`worker.actor.clip_ratio_low` is -0.2; it must be >= 0."),
        ("worker.actor.clip_ratio_high=-0.3", "`worker.actor.clip_ratio_high` is -0.3; it must be >= 0."),
        ("worker.actor.clip_ratio_dual=1", "`worker.actor.clip_ratio_dual` is 1.0; it must be > 1 (dual-clip PPO"),
        ("worker.rollout.temperature=-0.5", "`worker.rollout.temperature` is -0.5; it must be > 0"),
        ("worker.rollout.temperature=0", "val_override_config.temperature=0, and for greedy `easyrl generate` or"),
        ("worker.rollout.top_p=0", "`worker.rollout.top_p` is 0.0; it must be in (0, 1]."),
        ("worker.rollout.top_p=1.1", "`worker.rollout.top_p` is 1.1; it must be in (0, 1]."),
        (
            "worker.rollout.gpu_memory_utilization=0",
            "`worker.rollout.gpu_memory_utilization` is 0.0; it must be in (0, 1]",
        ),
        ("worker.rollout.gpu_memory_utilization=90", "`worker.rollout.gpu_memory_utilization` is 90.0"),
        ("worker.rollout.n=0", "`worker.rollout.n` is 0; it must be >= 1."),
        ("data.rollout_batch_size=0", "`data.rollout_batch_size` is 0; it must be >= 1."),
        ("worker.actor.micro_batch_size_per_device_for_experience=0", "for_experience` is 0; it must be >= 1."),
        ("data.val_batch_size=0", "`data.val_batch_size` is 0; it must be >= 1, or -1."),
        ("data.max_prompt_length=0", "`data.max_prompt_length` is 0; it must be >= 1."),
        ("data.max_response_length=-5", "`data.max_response_length` is -5; it must be >= 1."),
        ("worker.rollout.max_model_len=0", "`worker.rollout.max_model_len` is 0; it must be >= 1."),
        ("algorithm.kl_coef=-0.001", "`algorithm.kl_coef` is -0.001; it must be >= 0."),
        ("algorithm.gamma=1.01", "`algorithm.gamma` is 1.01; it must be in [0, 1]."),
        ("algorithm.lam=-0.1", "`algorithm.lam` is -0.1; it must be in [0, 1]."),
        ("worker.reward.timeout_s=0", "`worker.reward.timeout_s` is 0.0; it must be > 0."),
        ("trainer.total_epochs=0", "`trainer.total_epochs` is 0; it must be >= 1."),
        ("worker.rollout.val_override_config={temperature: -1}", "val_override_config.temperature` is -1; it must"),
        ("worker.rollout.val_override_config={max_tokens: 8}", "unknown sampling key(s) ['max_tokens']"),
    ],
)
def test_value_out_of_range_names_key_value_and_range(valid_args, override, message):
    with pytest.raises(ConfigError) as refusal:
        load_run_plan([*valid_args, override])
    assert message in str(refusal.value)


@pytest.mark.parametrize(
    "override",
    [
        "worker.actor.clip_ratio_low=0",  # EasyR1's CISPO recipe
        "data.val_batch_size=-1",
        "worker.rollout.top_p=1",
        "worker.rollout.val_override_config={temperature: 0, n: 1}",
        "algorithm.kl_coef=0",
        "worker.actor.optim.weight_decay=0",
        "worker.rollout.gpu_memory_utilization=1",
    ],
)
def test_values_at_the_edges_of_their_range_pass(valid_args, override):
    load_run_plan([*valid_args, override])


def test_every_ranged_key_exists_and_its_default_is_in_range():
    config = PPOConfig()
    for key, interval in RANGES.items():
        value = config
        for part in key.split("."):
            value = getattr(value, part)  # AttributeError: a key in RANGES that the schema does not have
        if value is not None and key != "worker.ref.micro_batch_size_per_device_for_experience":  # -1: "actor's"
            assert interval.admits(value), (key, value, str(interval))


def test_sampling_override_keys_are_the_sampling_settings():
    from easyrl.workers.rollout.base import SamplingSettings

    assert set(SAMPLING_OVERRIDE_KEYS) == {f.name for f in dataclasses.fields(SamplingSettings)} - {
        "max_tokens",
        "engine",
    }


def test_ranges_are_in_the_config_docs():
    text = (ROOT / "docs" / "config.md").read_text()
    assert "| `worker.rollout.top_p` | float | `1.0` | Nucleus sampling threshold. Allowed: (0, 1]. |" in text


def test_fsdp_size_must_divide_the_workers(valid_args):
    with pytest.raises(ConfigError, match=r"`worker\.actor\.fsdp\.fsdp_size` \(3\) must divide the number of workers"):
        load_run_plan([*valid_args, "trainer.n_gpus_per_node=4", "worker.actor.fsdp.fsdp_size=3"])


def test_scheduler_token_budget_must_hold_a_whole_prompt(valid_args):
    args = [*valid_args, "data.max_prompt_length=6000", "data.max_response_length=4000"]
    with pytest.raises(ConfigError, match=r"`worker\.rollout\.max_num_batched_tokens` \(8192\) is smaller than the"):
        load_run_plan(args)
    load_run_plan([*args, "worker.rollout.enable_chunked_prefill=true"])


@pytest.mark.parametrize("name", ["nope.jsonl", "data/nope.parquet", "./nope.csv"])
def test_missing_train_file_is_named_by_check(valid_args, tmp_path, monkeypatch, name):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match=rf"`data\.train_files`: data file `{name}` does not exist"):
        load_run_plan([*valid_args, f"data.train_files={name}"])


def test_model_path_that_is_a_file_is_refused(valid_args, tmp_path):
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(b"")
    with pytest.raises(ConfigError, match=r"`worker\.actor\.model\.model_path`: `.*model\.safetensors` is a file"):
        load_run_plan([*valid_args, f"worker.actor.model.model_path={weights}"])


def test_hub_id_with_offline_mode_declared_is_refused_by_check(valid_args, no_hub_settings, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ConfigError) as refusal:
        load_run_plan([*valid_args, f"worker.actor.model.model_path={HUB_ID}"])
    assert str(refusal.value).startswith(
        f"`worker.actor.model.model_path={HUB_ID}`: not a local folder, and the model hub is unreachable "
        "(HF_HUB_OFFLINE=1); give a local path"
    )


def test_hub_id_in_the_local_cache_passes_offline(valid_args, no_hub_settings, monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    snapshot = tmp_path / "hub_cache" / "models--no-such-org--no-such-model" / "snapshots" / "abc123"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text("{}")
    plan = load_run_plan([*valid_args, f"worker.actor.model.model_path={HUB_ID}"])
    check_model_sources(plan.config)


def test_hub_id_without_offline_mode_passes_check_without_network(valid_args, no_hub_settings):
    plan = load_run_plan([*valid_args, f"worker.actor.model.model_path={HUB_ID}"])
    assert plan.config.worker.actor.model.model_path == HUB_ID


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_driver_refuses_a_hub_id_at_once_when_no_hub_answers(valid_args, no_hub_settings, monkeypatch):
    port = _closed_port()
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}")
    plan = load_run_plan([*valid_args, f"worker.actor.model.model_path={HUB_ID}"])
    start = time.monotonic()
    with pytest.raises(ConfigError) as refusal:
        check_model_sources(plan.config)
    assert time.monotonic() - start < 2 * validate.HUB_PROBE_TIMEOUT_S
    assert str(refusal.value).startswith(
        f"`worker.actor.model.model_path={HUB_ID}`: not a local folder, and the model hub is unreachable "
        f"(no connection to 127.0.0.1:{port} within 0.8 s)"
    )


def test_driver_probe_that_hangs_ends_at_its_timeout(valid_args, no_hub_settings, monkeypatch):
    # a server whose accept queue is full (backlog 0 holds one pending connection): Linux drops further SYNs, so a
    # connect hangs, as it does behind a firewall that drops packets
    with socket.socket() as server, socket.socket() as pending:
        server.bind(("127.0.0.1", 0))
        server.listen(0)
        port = server.getsockname()[1]
        pending.connect(("127.0.0.1", port))
        monkeypatch.setenv("HF_ENDPOINT", f"https://127.0.0.1:{port}")
        plan = load_run_plan([*valid_args, f"worker.actor.model.model_path={HUB_ID}"])
        start = time.monotonic()
        with pytest.raises(ConfigError, match=rf"no connection to 127\.0\.0\.1:{port} within 0\.8 s"):
            check_model_sources(plan.config)
        elapsed = time.monotonic() - start
    assert validate.HUB_PROBE_TIMEOUT_S <= elapsed < 2 * validate.HUB_PROBE_TIMEOUT_S


def test_driver_accepts_a_hub_id_when_the_hub_answers(valid_args, no_hub_settings, monkeypatch):
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{server.getsockname()[1]}")
        plan = load_run_plan([*valid_args, f"worker.actor.model.model_path={HUB_ID}"])
        check_model_sources(plan.config)


def test_check_imports_no_torch_and_answers_in_seconds(valid_args):
    code = (
        "import sys, time; start = time.monotonic(); from easyrl.config import load_run_plan; "
        f"load_run_plan({valid_args!r}); "
        "print('torch' in sys.modules, round(time.monotonic() - start, 2))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120, env=dict(os.environ)
    )
    torch_loaded, seconds = result.stdout.split()
    assert torch_loaded == "False", result.stderr
    print(f"check took {seconds} s")
