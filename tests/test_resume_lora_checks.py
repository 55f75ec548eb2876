"""A run resumes a checkpoint's actor only as it was trained: LoRA or full weights alike, the same LoRA rank, alpha and
adapted modules, the adapters on the base model they were trained on. A mismatch stops the run before Ray starts with
one line naming both values and the ways out (it used to crash a minute later on a tensor shape, or train the
adapters on another base without a word)."""

import os
import shutil
from pathlib import Path

import pytest
import torch

from easyrl.config import PPOConfig
from easyrl.config.schema import LoraConfig
from easyrl.models import lora
from easyrl.trainer.checkpoint import CheckpointError, CheckpointManager, check_resume_point
from easyrl.workers.fsdp_checkpoint import load_role_checkpoint, merge_checkpoint_to_hf, save_role_checkpoint


# Single-process torch.distributed.checkpoint saves warn that no process group exists: expected here.
pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")

RANK, ALPHA = 4, 8
PROJECTIONS = "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj"
FRESH_START = "or start afresh in a new trainer.save_checkpoint_path"


@pytest.fixture(scope="module")
def bases(tmp_path_factory):
    """Two models of one architecture with different weights (as a base and its instruct variant are)."""
    from easyrl.testing.tiny_models import build_tiny_causal_lm

    root = tmp_path_factory.mktemp("bases")
    return build_tiny_causal_lm(root / "base_a", seed=0), build_tiny_causal_lm(root / "base_b", seed=1)


def _save_checkpoint(root, base, lora_config: LoraConfig | None = None, step: int = 2) -> str:
    """A checkpoint as `easyrl train` writes it: the actor through the workers' save (LoRA: the adapters and the
    peft adapter config naming the base they were trained on), then the driver's files through CheckpointManager."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(base), dtype=torch.float32)
    if lora_config is not None:
        model = lora.apply_lora(model, lora_config, is_vision_language=False)
    optimizer = torch.optim.AdamW([param for param in model.parameters() if param.requires_grad], lr=1e-3)
    manager = CheckpointManager(str(root))
    save_role_checkpoint(os.path.join(manager.begin(step), "actor"), model, optimizer, None)
    return manager.commit(step, trainer_state={"epoch": 0}, dataloader_state={"batches": step}, required=("actor",))


def _lora_checkpoint(root, base) -> str:
    return _save_checkpoint(root, base, LoraConfig(rank=RANK, alpha=ALPHA))


def _config(save_dir, model_path, rank: int = RANK, alpha: int = ALPHA, load=None, **lora_keys) -> PPOConfig:
    config = PPOConfig()
    config.trainer.save_checkpoint_path = str(save_dir)
    config.trainer.load_checkpoint_path = load
    config.worker.actor.model.model_path = str(model_path)
    config.worker.actor.model.lora = LoraConfig(rank=rank, alpha=alpha, **lora_keys)
    return config


def _refusal(config) -> str:
    with pytest.raises(CheckpointError) as caught:
        check_resume_point(config)
    message = str(caught.value)
    assert "\n" not in message
    return message


@pytest.mark.parametrize(
    ("keys", "expected"),
    [
        ({"rank": 8}, "worker.actor.model.lora.rank is 4 in the checkpoint and 8 in this run's config. Set it as"),
        ({"alpha": 16}, "worker.actor.model.lora.alpha is 8 in the checkpoint and 16 in this run's config"),
        (
            {"rank": 8, "alpha": 16},
            "lora.rank is 4 in the checkpoint and 8 in this run's config; worker.actor.model.lora.alpha is 8 in the "
            "checkpoint and 16 in this run's config. Set them as the checkpoint has them",
        ),
        (
            {"target_modules": "q_proj,v_proj"},
            "worker.actor.model.lora.target_modules is down_proj,gate_proj,k_proj,o_proj,q_proj,up_proj,v_proj in "
            "the checkpoint and q_proj,v_proj in this run's config",
        ),
        (
            {"exclude_modules": r".*layers\.1\..*"},
            r"are `(?:lm_head)` in the checkpoint and `(?:lm_head)|(?:.*layers\.1\..*)` in this run's config",
        ),
    ],
    ids=["rank", "alpha", "rank_and_alpha", "target_modules", "exclude_modules"],
)
def test_a_lora_checkpoint_resumes_only_with_the_rank_alpha_and_modules_it_was_trained_with(
    tmp_path, bases, keys, expected
):
    base, _ = bases
    path = _lora_checkpoint(tmp_path / "run", base)

    message = _refusal(_config(tmp_path / "run", base, **keys))
    assert message.startswith(f"Cannot resume from {path}: ")
    assert expected in message and message.endswith(f"{FRESH_START}.")
    # the config it was trained with resumes, the same modules named one by one too
    assert check_resume_point(_config(tmp_path / "run", base)) == path
    assert check_resume_point(_config(tmp_path / "run", base, target_modules=PROJECTIONS)) == path


def test_switching_between_lora_and_full_weights_is_refused_naming_the_rank_and_both_ways_out(tmp_path, bases):
    base, _ = bases
    lora_path = _lora_checkpoint(tmp_path / "lora_run", base)
    full_path = _save_checkpoint(tmp_path / "full_run", base)

    message = _refusal(_config(tmp_path / "lora_run", base, rank=0))
    assert (
        f"Cannot resume from {lora_path}: it holds LoRA adapters (rank 4) and this run trains full weights" in message
    )
    assert f"Set worker.actor.model.lora.rank=4 as the checkpoint has it, {FRESH_START}" in message
    message = _refusal(_config(tmp_path / "full_run", base, rank=8))
    assert (
        f"{full_path}: it holds full weights and this run trains LoRA adapters (worker.actor.model.lora.rank=8)"
        in (message)
    )
    assert f"Set worker.actor.model.lora.rank=0 as the checkpoint has it, {FRESH_START}" in message
    # a checkpoint given explicitly: point trainer.load_checkpoint_path elsewhere
    message = _refusal(_config(tmp_path / "elsewhere", base, rank=0, load=lora_path))
    assert "or point trainer.load_checkpoint_path at a checkpoint of such a run" in message

    assert check_resume_point(_config(tmp_path / "full_run", base, rank=0)) == full_path
    assert check_resume_point(_config(tmp_path / "elsewhere", base, load=lora_path)) == lora_path


def test_lora_adapters_resume_only_on_the_base_model_they_were_trained_on(tmp_path, bases, caplog):
    base_a, base_b = bases
    path = _lora_checkpoint(tmp_path / "run", base_a)

    message = _refusal(_config(tmp_path / "run", base_b))
    assert (
        f"Cannot resume from {path}: its LoRA adapters were trained on {base_a} (base_model_name_or_path in "
        f"{path}/actor/huggingface/adapter_config.json) and this run's worker.actor.model.model_path is {base_b}, "
        f"whose weight files differ. Set worker.actor.model.model_path={base_a} as the checkpoint has it, "
        f"{FRESH_START}."
    ) in message

    # the same folder through a link, and a copy of it elsewhere (with a warning), are the same base
    os.symlink(base_a, tmp_path / "link")
    assert check_resume_point(_config(tmp_path / "run", tmp_path / "link")) == path
    shutil.copytree(base_a, tmp_path / "copy")
    assert check_resume_point(_config(tmp_path / "run", tmp_path / "copy")) == path
    assert "whose weight files are the same (names, sizes and sampled bytes): resuming" in caplog.text


def test_a_base_moved_away_passes_with_a_warning_unless_its_architecture_differs(tmp_path, caplog):
    from easyrl.testing.tiny_models import build_tiny_causal_lm

    base = build_tiny_causal_lm(tmp_path / "disk1" / "base")
    path = _lora_checkpoint(tmp_path / "run", base)
    moved = Path(shutil.move(base, tmp_path / "disk2"))
    other = build_tiny_causal_lm(tmp_path / "wider", hidden_size=128, num_heads=4)

    assert check_resume_point(_config(tmp_path / "run", moved)) == path
    assert f"trained on {base}, which is not there any more; this run loads them onto {moved}" in caplog.text
    message = _refusal(_config(tmp_path / "run", other))
    assert f"model_path is {other}, a model of another architecture (hidden_size 64 and 128, " in message
    assert f"Set worker.actor.model.model_path={base} as the checkpoint has it" in message


def test_a_builtin_model_path_is_compared_as_the_folder_it_resolves_to(tmp_path, bases, monkeypatch):
    from easyrl.demo import builtin_models

    base_a, base_b = bases
    path = _lora_checkpoint(tmp_path / "run", base_a)
    monkeypatch.setitem(builtin_models.BUILTIN_MODELS, "Base-A", lambda: base_a)
    monkeypatch.setitem(builtin_models.BUILTIN_MODELS, "Base-B", lambda: base_b)

    assert check_resume_point(_config(tmp_path / "run", "builtin://Base-A")) == path
    assert f"model_path is {base_b}, whose weight files differ" in _refusal(
        _config(tmp_path / "run", "builtin://Base-B")
    )


def test_a_checkpoint_merged_in_place_is_checked_by_its_moved_adapter_config(tmp_path, bases):
    """`easyrl merge` into actor/huggingface/ moves the adapter config to actor/lora_adapter/."""
    base, _ = bases
    path = _lora_checkpoint(tmp_path / "run", base)
    actor = os.path.join(path, "actor")
    merge_checkpoint_to_hf(actor, os.path.join(actor, "huggingface"))
    assert os.path.isfile(os.path.join(actor, "lora_adapter", "adapter_config.json"))

    assert "lora.rank is 4 in the checkpoint and 8" in _refusal(_config(tmp_path / "run", base, rank=8))
    assert "it holds LoRA adapters (rank 4)" in _refusal(_config(tmp_path / "run", base, rank=0))
    assert check_resume_point(_config(tmp_path / "run", base)) == path


def test_the_workers_refusal_of_the_other_kind_names_both_ways_out(tmp_path, bases):
    """The workers' own check (a last line behind check_resume_point) no longer sends an automatic resume to
    trainer.load_checkpoint_path, which it never set."""
    from transformers import AutoModelForCausalLM

    base, _ = bases
    path = _lora_checkpoint(tmp_path / "run", base)
    with pytest.raises(ValueError, match="holds LoRA adapters but this run trains full weights") as caught:
        load_role_checkpoint(os.path.join(path, "actor"), AutoModelForCausalLM.from_pretrained(str(base)), None, None)
    assert (
        "or start afresh in a new trainer.save_checkpoint_path (where trainer.load_checkpoint_path names this"
        in str(caught.value)
    )


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_easyrl_train_with_a_new_lora_rank_stops_before_ray_with_one_line(tmp_path, tiny_model_path):
    from tests.fixtures.trainer_runs import REPO_ROOT, run_easyrl

    save_dir = tmp_path / "run"
    path = _lora_checkpoint(save_dir, tiny_model_path)
    result = run_easyrl(
        "train",
        f"config={REPO_ROOT / 'examples' / 'smollm2_arithmetic_grpo_lora.yaml'}",
        f"worker.actor.model.model_path={tiny_model_path}",
        f"trainer.save_checkpoint_path={save_dir}",
        "worker.actor.model.lora.rank=16",
        "worker.actor.model.lora.alpha=8",
        timeout=240,
    )
    assert result.returncode == 2, result.stderr[-3000:]
    assert (
        f"easyrl train: cannot start: Cannot resume from {path}: worker.actor.model.lora.rank is 4 in the checkpoint "
        f"and 16 in this run's config. Set it as the checkpoint has it, {FRESH_START}."
    ) in result.stderr
    assert "Traceback" not in result.stderr
    assert not (save_dir / "logs" / "actor_rollout_0.log").exists()  # no worker started


@pytest.mark.timeout(300)
def test_easyrl_check_reads_the_checkpoint_the_run_would_resume_as_the_run_does(tmp_path, tiny_model_path):
    """What check accepts starts: it refuses a checkpoint the run would refuse, and says where the run starts."""
    from tests.fixtures.trainer_runs import REPO_ROOT, run_easyrl

    save_dir = tmp_path / "run"
    path = _lora_checkpoint(save_dir, tiny_model_path)  # of step 2
    recipe = [
        f"config={REPO_ROOT / 'examples' / 'smollm2_arithmetic_grpo_lora.yaml'}",
        f"worker.actor.model.model_path={tiny_model_path}",
        f"worker.actor.model.lora.rank={RANK}",
        f"worker.actor.model.lora.alpha={ALPHA}",
    ]
    resumes = run_easyrl("check", *recipe, f"trainer.save_checkpoint_path={save_dir}", timeout=120)
    assert resumes.returncode == 0, resumes.stderr[-2000:]
    assert resumes.stdout.rstrip().endswith(f"#   resumes from {path} (after step 2)")
    assert (
        "#   validation: not before training (it resumes after step 2), every 5 steps, at the end\n" in resumes.stdout
    )
    done = run_easyrl("check", *recipe, f"trainer.save_checkpoint_path={save_dir}", "trainer.max_steps=2", timeout=120)
    assert done.returncode == 0 and f"#   resumes from {path} (after step 2); Nothing to train: " in done.stdout
    for overrides, refusal in [
        (["worker.actor.model.lora.rank=16"], "worker.actor.model.lora.rank is 4 in the checkpoint and 16 in this"),
        (
            ["trainer.find_last_checkpoint=false"],
            "holds the checkpoints of an earlier run (1, the last global_step_2)",
        ),
    ]:
        refused = run_easyrl("check", *recipe, f"trainer.save_checkpoint_path={save_dir}", *overrides, timeout=120)
        assert refused.returncode == 2, refused.stdout[-2000:]
        assert refused.stderr.startswith("easyrl check: invalid config: ") and refusal in refused.stderr
        assert "Traceback" not in refused.stderr
    fresh = run_easyrl("check", *recipe, f"trainer.save_checkpoint_path={tmp_path / 'new'}", timeout=120)
    assert fresh.returncode == 0 and fresh.stdout.rstrip().endswith("#   starts afresh")
    assert not (tmp_path / "new").exists()  # check writes nothing


def test_a_changed_lora_vision_tower_is_named_as_the_key_that_changed(tmp_path):
    """A vision-language model's adapters on its vision encoder or not: the refusal names lora.vision_tower, the key
    the user changed, not the target_modules both runs share."""
    from transformers import AutoModelForImageTextToText

    from easyrl.testing.tiny_vlms import build_tiny_vlm

    base = build_tiny_vlm("qwen2_5_vl", tmp_path / "vlm")
    for saved_tower in (False, True):
        model = AutoModelForImageTextToText.from_pretrained(str(base), dtype=torch.float32)
        model = lora.apply_lora(
            model, LoraConfig(rank=RANK, alpha=ALPHA, vision_tower=saved_tower), is_vision_language=True
        )
        manager = CheckpointManager(str(tmp_path / f"run_{saved_tower}"))
        save_role_checkpoint(os.path.join(manager.begin(1), "actor"), model, None, None)
        path = manager.commit(1, trainer_state={"epoch": 0}, dataloader_state={"batches": 1}, required=("actor",))
        same = _config(tmp_path / f"run_{saved_tower}", base, vision_tower=saved_tower)
        assert check_resume_point(same) == path
        message = _refusal(_config(tmp_path / f"run_{saved_tower}", base, vision_tower=not saved_tower))
        assert (
            f"Cannot resume from {path}: worker.actor.model.lora.vision_tower is {saved_tower} in the checkpoint and "
            f"{not saved_tower} in this run's config. Set it as the checkpoint has it, {FRESH_START}."
        ) in message
        assert "target_modules" not in message


def test_an_exclusion_respelled_or_dropped_resumes_when_the_adapted_modules_are_the_same(tmp_path):
    """EasyR1's `exclude_modules: .*visual.*` excludes what lora.vision_tower=false already keeps free of adapters:
    the checkpoint resumes with it dropped or spelled otherwise (before: the exclusion regexes were compared as text,
    and the resume was refused). An exclusion that removes more modules is still refused."""
    from transformers import AutoModelForImageTextToText

    from easyrl.testing.tiny_vlms import build_tiny_vlm

    base = build_tiny_vlm("qwen2_5_vl", tmp_path / "vlm")
    model = AutoModelForImageTextToText.from_pretrained(str(base), dtype=torch.float32)
    model = lora.apply_lora(
        model, LoraConfig(rank=RANK, alpha=ALPHA, exclude_modules=".*visual.*"), is_vision_language=True
    )
    manager = CheckpointManager(str(tmp_path / "run"))
    save_role_checkpoint(os.path.join(manager.begin(1), "actor"), model, None, None)
    path = manager.commit(1, trainer_state={"epoch": 0}, dataloader_state={"batches": 1}, required=("actor",))
    for exclude in (".*visual.*", None, r"model\.visual.*", ".*no_such_module.*"):
        assert check_resume_point(_config(tmp_path / "run", base, exclude_modules=exclude)) == path, exclude
    message = _refusal(_config(tmp_path / "run", base, exclude_modules=r".*layers\.0\..*"))
    assert "the modules kept free of adapters (worker.actor.model.lora.exclude_modules" in message


def test_a_checkpoint_trained_with_the_vision_tower_frozen_does_not_resume_with_it_trained(tmp_path, bases):
    """Its optimizer holds no state for the tower's weights: the workers' load failed after Ray started, on a missing
    optimizer key, naming neither the setting nor a way out. Freezing a tower the checkpoint trained resumes."""
    import yaml

    base, _ = bases
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text(yaml.safe_dump({"worker": {"actor": {"model": {"freeze_vision_tower": True}}}}))
    path = _save_checkpoint(run, base)
    assert (Path(path) / "config.yaml").is_file()

    message = _refusal(_config(run, base, rank=0))
    assert message.startswith(
        f"Cannot resume from {path}: it was trained with worker.actor.model.freeze_vision_tower=true, so its "
        "optimizer holds no state for the vision tower's weights"
    )
    assert f"Set worker.actor.model.freeze_vision_tower=true as the checkpoint has it, {FRESH_START}" in message
    frozen = _config(run, base, rank=0)
    frozen.worker.actor.model.freeze_vision_tower = True
    assert check_resume_point(frozen) == path
    (run / "config.yaml").write_text(yaml.safe_dump({"worker": {"actor": {"model": {"freeze_vision_tower": False}}}}))
    trained = _save_checkpoint(run, base, step=3)
    assert check_resume_point(frozen) == trained
