"""LoRA training on FSDP2 workers (Ray + gloo, 2 workers): only the adapters move, the reference is the base model,
checkpoints hold the adapters (and their optimizer state) alone, and `easyrl merge` gives an adapter folder or the
merged model. The slow tests train real `easyrl train` runs (text, resume after SIGKILL, a tiny Qwen2.5-VL)."""

import json
import math
import os
import signal

import pytest
import torch

import easyrl  # noqa: F401  (process environment before Ray starts)
from easyrl.workers.fsdp_worker import FSDPWorker
from tests.fixtures.trainer_runs import (
    GRPO_RUN_OVERRIDES,
    REPO_ROOT,
    WORD_START_REWARD,
    checkpoint_weights,
    kill_process_group,
    launch_training,
    metrics_by_step,
    run_easyrl,
    run_training,
    train_args,
    wait_for_path,
)
from tests.fsdp_helpers import (
    add_policy_targets,
    load_hf_causal_lm,
    make_batch,
    per_sequence_log_probs,
    worker_config,
    worker_group,
)


RANK, ALPHA = 4, 8
OPTIM_LR, LORA_LR = 0.1, 0.5  # the adapters train at lora.lr, not optim.lr
PEFT_PREFIX = "base_model.model."


def _lora_worker_config(model_path, n_workers: int):
    config = worker_config(model_path, n_workers, strategy="sgd", lr=OPTIM_LR)
    config.actor.model.lora.rank = RANK
    config.actor.model.lora.alpha = ALPHA
    config.actor.model.lora.lr = LORA_LR
    return config


@pytest.fixture(scope="module")
def lora_workers(ray_cluster, tiny_model_path):
    """2 workers with the actor alone: with LoRA the reference log-probs come from it, adapters off."""
    config = _lora_worker_config(tiny_model_path, 2)
    with worker_group(FSDPWorker, config, "actor", processes=2, name_prefix="lora") as group:
        yield group


def _base_name(name: str) -> str:
    """The Hugging Face name of a base weight inside the peft wrapper."""
    return name.removeprefix(PEFT_PREFIX).replace(".base_layer.", ".")


def _split(state: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """(base weights under their Hugging Face names, adapter tensors under their module names)."""
    base = {_base_name(k): v for k, v in state.items() if ".lora_" not in k}
    adapters = {k: v for k, v in state.items() if ".lora_" in k}
    return base, adapters


def _trained_step(group, seed: int):
    data = make_batch(batch_size=6, seed=seed)
    data = add_policy_targets(data, group.compute_log_probs(data).batch["old_log_probs"], seed=seed)
    metrics = group.update_actor(data).meta_info["metrics"]
    assert metrics["actor/nonfinite_grad_skipped_steps"] == 0
    assert metrics["actor/lr"] == LORA_LR
    return data


@pytest.mark.timeout(300)
def test_lora_update_moves_only_the_adapters_and_the_reference_stays_the_base(lora_workers, tiny_model_path):
    lora_workers.init_model()
    original = load_hf_causal_lm(tiny_model_path)
    base, adapters = _split(lora_workers.get_full_state_dict())
    assert set(base) == set(original.state_dict())
    # 2 layers x 7 projections x (A, B); B starts at zero, so the adapted model starts as the base model
    assert len(adapters) == 28
    assert all(not v.any() for k, v in adapters.items() if ".lora_B." in k)

    data = _trained_step(lora_workers, seed=1)
    base_after, adapters_after = _split(lora_workers.get_full_state_dict())
    for name, tensor in original.state_dict().items():
        assert torch.equal(base_after[name], tensor), name  # bit-identical: frozen, and never in the optimizer
    moved = [k for k in adapters if not torch.equal(adapters_after[k], adapters[k])]
    # SGD's first step: dL/dB = (dL/dy) (A x)^T != 0, dL/dA = B^T (dL/dy) x^T = 0 while B is zero
    assert moved and all(".lora_B." in k for k in moved)
    assert len(moved) == 14

    # reference = the base model's log-probs (plain HF forward), the actor's have moved away from them
    ref = lora_workers.compute_ref_log_probs(data).batch["ref_log_probs"]
    torch.testing.assert_close(ref, per_sequence_log_probs(original, data, 0.7), atol=1e-5, rtol=0)
    actor = lora_workers.compute_log_probs(data).batch["old_log_probs"]
    assert (actor - ref).abs().max() > 1e-3


@pytest.mark.timeout(300)
def test_lora_checkpoint_holds_the_adapters_alone_and_restores_them(lora_workers, tmp_path):
    import torch.distributed.checkpoint as dcp

    lora_workers.init_model()
    data = _trained_step(lora_workers, seed=3)
    saved = lora_workers.get_full_state_dict()
    lora_workers.save_checkpoint(str(tmp_path))
    keys = dcp.FileSystemReader(str(tmp_path)).read_metadata().state_dict_metadata
    model_keys = [k for k in keys if k.startswith("model.")]
    assert len(model_keys) == 28 and all(".lora_" in k for k in model_keys)
    # SGD keeps no state, but the optimizer's parameter groups are saved under the adapters' names only
    assert not [k for k in keys if k.startswith("optimizer.") and ".lora_" not in k and "param_groups" not in k]

    _trained_step(lora_workers, seed=4)
    assert not torch.equal(
        lora_workers.get_full_state_dict()[model_keys[1][len("model.") :]], saved[model_keys[1][6:]]
    )
    lora_workers.load_checkpoint(str(tmp_path))
    restored = lora_workers.get_full_state_dict()
    for name, tensor in saved.items():
        assert torch.equal(restored[name], tensor), name

    # huggingface/ is a peft adapter folder with the saved adapters
    from peft import PeftModel

    folder = tmp_path / "huggingface"
    assert {"adapter_config.json", "adapter_model.safetensors", "config.json"} <= {p.name for p in folder.iterdir()}
    adapter = json.loads((folder / "adapter_config.json").read_text())
    assert (adapter["r"], adapter["lora_alpha"]) == (RANK, ALPHA)
    loaded = PeftModel.from_pretrained(load_hf_causal_lm(adapter["base_model_name_or_path"]), folder)
    live = lora_workers.compute_log_probs(data).batch["old_log_probs"]
    torch.testing.assert_close(per_sequence_log_probs(loaded, data, 0.7), live, atol=1e-5, rtol=0)


@pytest.mark.timeout(300)
def test_merge_writes_the_merged_model_or_the_adapter_folder(lora_workers, tiny_model_path, tmp_path, caplog):
    import logging
    import shutil

    from peft import PeftModel

    from easyrl.trainer.merge import merge_checkpoint

    lora_workers.init_model()
    data = _trained_step(lora_workers, seed=5)
    _trained_step(lora_workers, seed=6)  # A moves too once B is nonzero
    lora_workers.save_checkpoint(str(tmp_path / "ckpt"))
    live = lora_workers.compute_log_probs(data).batch["old_log_probs"]

    adapter_dir = merge_checkpoint(str(tmp_path / "ckpt"), str(tmp_path / "adapter"), adapter_only=True)
    assert {p.name for p in (tmp_path / "adapter").iterdir()} >= {"adapter_config.json", "adapter_model.safetensors"}
    assert not (tmp_path / "adapter" / "model.safetensors").exists()
    with_adapter = PeftModel.from_pretrained(load_hf_causal_lm(tiny_model_path), adapter_dir)
    torch.testing.assert_close(per_sequence_log_probs(with_adapter, data, 0.7), live, atol=1e-5, rtol=0)

    merged_dir = merge_checkpoint(str(tmp_path / "ckpt"), str(tmp_path / "merged"))  # the default, as EasyR1's
    merged = load_hf_causal_lm(merged_dir)
    assert not any("lora" in name for name in merged.state_dict())
    ids = make_batch(batch_size=2, seed=7).batch["input_ids"]
    with torch.no_grad():
        torch.testing.assert_close(merged(ids).logits, with_adapter(input_ids=ids).logits, atol=1e-5, rtol=0)
    # the merged weights differ from the base exactly where adapters sit
    base = load_hf_causal_lm(tiny_model_path).state_dict()
    state = merged.state_dict()
    assert not torch.equal(
        state["model.layers.0.self_attn.q_proj.weight"], base["model.layers.0.self_attn.q_proj.weight"]
    )
    assert torch.equal(state["model.embed_tokens.weight"], base["model.embed_tokens.weight"])
    assert torch.equal(state["model.norm.weight"], base["model.norm.weight"])

    # in place (EasyR1's command: --local_dir only): huggingface/ becomes the merged model, the adapters move to
    # lora_adapter/ (a folder holding both would load in transformers as base + adapters); merging again still works
    role = tmp_path / "in_place"
    shutil.copytree(tmp_path / "ckpt", role)
    for attempt in range(2):
        with caplog.at_level(logging.WARNING, logger="easyrl.workers.fsdp_checkpoint"):
            assert merge_checkpoint(str(role)) == str(role / "huggingface")
        names = {p.name for p in (role / "huggingface").iterdir()}
        assert "model.safetensors" in names and not names & {"adapter_config.json", "adapter_model.safetensors"}
        assert {p.name for p in (role / "lora_adapter").iterdir()} == {
            "adapter_config.json",
            "adapter_model.safetensors",
        }
        in_place = load_hf_causal_lm(role / "huggingface").state_dict()
        assert in_place.keys() == state.keys() and all(torch.equal(in_place[k], v) for k, v in state.items())
        assert ("adapters of" in caplog.text) == (attempt == 0)  # moved once
        caplog.clear()
    with pytest.raises(ValueError, match="holds the merged model, and the adapter folder is .*lora_adapter"):
        merge_checkpoint(str(role), adapter_only=True)  # in place: it would put the adapters beside the model
    # the set-aside adapters given as a model: the config check names the merged folder beside them
    from easyrl.config import ConfigError
    from easyrl.config.validate import _check_model_path

    with pytest.raises(ConfigError) as refused:
        _check_model_path("worker.actor.model.model_path", str(role / "lora_adapter"), True)
    assert str(refused.value).endswith(f"the merged model it wrote is `{role / 'huggingface'}`: give that folder.")
    again = merge_checkpoint(str(role), str(tmp_path / "adapter_again"), adapter_only=True)
    # an adapter folder, without the merged model's weights that huggingface/ now holds
    assert not {p.name for p in (tmp_path / "adapter_again").iterdir()} & {"model.safetensors", "config.json"}
    with_adapter_again = PeftModel.from_pretrained(load_hf_causal_lm(tiny_model_path), again)
    torch.testing.assert_close(per_sequence_log_probs(with_adapter_again, data, 0.7), live, atol=1e-5, rtol=0)

    # a base that is not here: a missing folder, or a hub id out of reach (offline), says how to go on
    config_file = role / "lora_adapter" / "adapter_config.json"
    adapter_config = json.loads(config_file.read_text())
    for base in ("/nowhere/base-model", "someone/not-in-the-cache"):
        config_file.write_text(json.dumps({**adapter_config, "base_model_name_or_path": base}))
        args = ["--local_dir", str(role), "--output_dir", str(tmp_path / "x")]
        result = run_easyrl("merge", *args, env={**os.environ, "HF_HUB_OFFLINE": "1"})
        assert result.returncode == 2, result.stderr[-2000:]
        assert f"`{base}`" in result.stderr and "pass --base_model PATH" in result.stderr, result.stderr[-2000:]
        assert "--adapter_only to write the adapter folder" in result.stderr


# ----------------------------------------------------------------------------------------------------------------------
# real runs (slow): `easyrl train` with LoRA, 2 workers, 3 GRPO steps
# ----------------------------------------------------------------------------------------------------------------------
LORA_RUN_OVERRIDES = GRPO_RUN_OVERRIDES + [
    "worker.actor.model.lora.rank=8",
    "worker.actor.model.lora.alpha=16",
    "worker.actor.optim.lr=1e-2",
]
TIME_DEPENDENT_PREFIXES = ("timing/", "timing_per_token_ms/", "perf/", "rollout/")
EXACT_PREFIXES = ("reward/", "response_length/", "prompt_length/", "val/")


@pytest.fixture(scope="module")
def lora_run(tiny_model_path, tmp_path_factory):
    save_dir = tmp_path_factory.mktemp("lora_run") / "checkpoints"
    args = train_args(tiny_model_path, save_dir, LORA_RUN_OVERRIDES)
    run_training(args, save_dir.parent / "train.log")
    return save_dir


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_lora_run_trains_the_adapters_against_the_base_as_reference(lora_run, tiny_model_path):
    metrics = metrics_by_step(lora_run)
    assert sorted(metrics) == [1, 2, 3]
    # step 1: B = 0, the policy is the base model, so its KL to the reference (adapters off) is exactly 0
    assert metrics[1]["actor/kl_loss"] == 0.0
    assert metrics[3]["actor/kl_loss"] != 0.0
    assert all(math.isfinite(metrics[s]["actor/grad_norm"]) and metrics[s]["actor/grad_norm"] > 0 for s in (1, 2, 3))

    weights = checkpoint_weights(lora_run / "global_step_3" / "actor")
    assert weights and all(".lora_" in name for name in weights)
    assert any(".lora_B." in name and tensor.abs().max() > 0 for name, tensor in weights.items())
    adapter = json.loads((lora_run / "global_step_3" / "actor" / "huggingface" / "adapter_config.json").read_text())
    assert adapter["r"] == 8 and adapter["lora_alpha"] == 16

    # vLLM samples with the synced adapters: its log-probs are the actor's (fp32)
    for step in (1, 2, 3):
        assert metrics[step]["rollout/logprob_abs_diff/mean"] < 1e-3, step
    # only the adapters move into the engine: per layer (hidden 64, kv 32, mlp 128, rank 8) q 8x64+64x8, k and v
    # 8x64+32x8, o 8x64+64x8, gate and up 8x64+128x8, down 8x128+64x8 = 8192 values; 2 layers x 4 bytes = 65536
    for step in (2, 3):
        assert metrics[step]["rollout/weight_sync_bytes"] == 65536, step


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_easyrl_merge_of_a_lora_run_loads_as_adapter_and_as_merged_model(lora_run, tiny_model_path, tmp_path):
    from peft import PeftModel

    role = lora_run / "global_step_3" / "actor"
    for extra, out in ((["--adapter_only"], "adapter"), ([], "merged")):
        result = run_easyrl("merge", "--local_dir", str(role), "--output_dir", str(tmp_path / out), *extra)
        assert result.returncode == 0, result.stderr[-3000:]
    with_adapter = PeftModel.from_pretrained(load_hf_causal_lm(tiny_model_path), tmp_path / "adapter")
    merged = load_hf_causal_lm(tmp_path / "merged")
    ids = make_batch(batch_size=3, seed=8).batch["input_ids"]
    with torch.no_grad():
        expected = with_adapter(input_ids=ids).logits
        torch.testing.assert_close(merged(ids).logits, expected, atol=1e-5, rtol=0)
        with with_adapter.disable_adapter():
            assert (with_adapter(input_ids=ids).logits - expected).abs().max() > 1e-4  # the adapters matter


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_a_killed_lora_run_resumes_and_reproduces_the_next_step(lora_run, tiny_model_path, tmp_path):
    save_dir = tmp_path / "checkpoints"
    args = train_args(tiny_model_path, save_dir, LORA_RUN_OVERRIDES)
    killed_log = tmp_path / "killed.log"
    proc = launch_training(args, killed_log)
    try:
        wait_for_path(save_dir / "global_step_2" / "COMPLETE", proc, killed_log)
    finally:
        kill_process_group(proc)
    assert proc.returncode == -signal.SIGKILL, "the run ended on its own before it could be killed"
    assert not (save_dir / "global_step_3").exists()

    resumed_log = tmp_path / "resumed.log"
    run_training(args, resumed_log)
    assert f"Resuming from {save_dir / 'global_step_2'}" in resumed_log.read_text(errors="replace")
    resumed, reference = metrics_by_step(save_dir)[3], metrics_by_step(lora_run)[3]
    compared = sorted(name for name in reference if not name.startswith(TIME_DEPENDENT_PREFIXES))
    different = {}
    for name in compared:
        same = (
            resumed.get(name) == reference[name]
            if name.startswith(EXACT_PREFIXES) or not isinstance(reference[name], float)
            else math.isclose(resumed.get(name, math.nan), reference[name], rel_tol=1e-5, abs_tol=1e-7)
        )
        if not same:
            different[name] = (resumed.get(name), reference[name])
    assert not different, f"step 3 after the resume differs from the uninterrupted run: {different}"
    for name in ("reward/overall", "actor/pg_loss", "actor/kl_loss", "actor/grad_norm"):
        assert name in compared


VL_LORA_RUN_OVERRIDES = [
    f"config={REPO_ROOT / 'examples' / 'shapes_tiny_vl_grpo.yaml'}",
    f"data.format_prompt={REPO_ROOT / 'format_prompt' / 'r1v.jinja'}",
    f"worker.reward.reward_function={WORD_START_REWARD}:compute_score",
    "worker.reward.num_cpus=0",
    "worker.rollout.disable_tqdm=true",
    "worker.rollout.kv_cache_memory_bytes=67108864",
    "worker.actor.model.lora.rank=8",
    "worker.actor.model.lora.alpha=16",
    "worker.actor.optim.lr=1e-2",
    "algorithm.disable_kl=false",
    "algorithm.use_kl_loss=true",
    "trainer.n_gpus_per_node=2",
    "trainer.max_steps=3",
    "trainer.val_freq=-1",
    "trainer.save_freq=3",
]


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_vl_lora_run_trains_text_adapters_and_leaves_the_vision_tower_alone(tmp_path):
    from easyrl.testing.tiny_vlms import build_tiny_vlm

    model_path = build_tiny_vlm("qwen2_5_vl", tmp_path / "model")
    save_dir = tmp_path / "checkpoints"
    run_training(train_args(model_path, save_dir, VL_LORA_RUN_OVERRIDES), tmp_path / "train.log")
    metrics = metrics_by_step(save_dir)
    assert sorted(metrics) == [1, 2, 3]
    assert metrics[1]["actor/kl_loss"] == 0.0  # B = 0: the policy starts as the reference (adapters off)
    for step, row in metrics.items():
        assert math.isfinite(row["actor/pg_loss"]) and row["actor/grad_norm"] > 0, step
        assert row["rollout/logprob_abs_diff/mean"] < 1e-3, step
        # no adapters in the tower: it is frozen, so each step encodes its pictures once (measured 4 misses, 12 hits
        # per rank: old log-probs, the adapters-off reference and the update reuse them)
        assert row["perf/vision_cache_misses"] > 0 and row["perf/vision_cache_hits"] > 0, step
    weights = checkpoint_weights(save_dir / "global_step_3" / "actor")
    # 2 text layers x 7 projections x (A, B); nothing in the vision tower
    assert len(weights) == 28
    assert all(".language_model.layers." in name and ".lora_" in name for name in weights)
