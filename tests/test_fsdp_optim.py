"""Optimizers, learning-rate schedules and the clipped step (single process, plain tensors)."""

import logging
import math

import pytest
import torch

from easyrl.config import OptimConfig
from easyrl.workers.optim import (
    BF16StateAdamW,
    build_lr_scheduler,
    build_optimizer,
    clip_grad_norm_and_step,
    lr_multiplier,
)


def test_warmup_rises_linearly_to_the_peak():
    assert [lr_multiplier(s, 4, 100, "constant", 0.0) for s in range(6)] == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]


def test_cosine_decays_to_the_min_lr_ratio_at_the_last_step():
    assert lr_multiplier(2, 2, 12, "cosine", 0.1) == pytest.approx(1.0)
    assert lr_multiplier(7, 2, 12, "cosine", 0.1) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.5)))
    assert lr_multiplier(12, 2, 12, "cosine", 0.1) == pytest.approx(0.1)


def test_warmup_ratio_is_a_share_of_the_training_steps():
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    config = OptimConfig(lr=1.0, lr_warmup_ratio=0.5, training_steps=4)
    scheduler = build_lr_scheduler(optimizer, config, "worker.actor.optim")
    lrs = []
    for _ in range(4):
        lrs.append(scheduler.get_last_lr()[0])
        optimizer.step()
        scheduler.step()
    assert lrs == [0.5, 1.0, 1.0, 1.0]


def test_cosine_without_training_steps_names_the_key():
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    with pytest.raises(ValueError, match="worker.actor.optim.training_steps"):
        build_lr_scheduler(optimizer, OptimConfig(lr_scheduler_type="cosine"), "worker.actor.optim")


def test_unknown_optimizer_strategy_lists_the_choices():
    with pytest.raises(ValueError, match="adamw_bf16"):
        build_optimizer(torch.nn.Linear(2, 2), OptimConfig(strategy="lion"), "worker.actor.optim")


def test_bf16_state_adamw_tracks_torch_adamw():
    torch.manual_seed(0)
    reference = torch.nn.Linear(16, 16)
    ours = torch.nn.Linear(16, 16)
    ours.load_state_dict(reference.state_dict())
    opt_ref = torch.optim.AdamW(reference.parameters(), lr=1e-2, betas=(0.9, 0.999), weight_decay=0.01)
    opt_ours = BF16StateAdamW(ours.parameters(), lr=1e-2, betas=(0.9, 0.999), weight_decay=0.01)
    for step in range(5):
        x = torch.randn(8, 16, generator=torch.Generator().manual_seed(step))
        for model, opt in ((reference, opt_ref), (ours, opt_ours)):
            model(x).pow(2).mean().backward()
            opt.step()
            opt.zero_grad()
    assert opt_ours.state[ours.weight]["exp_avg"].dtype == torch.bfloat16
    torch.testing.assert_close(ours.weight, reference.weight, atol=2e-3, rtol=0)


def test_non_finite_gradient_skips_the_step():
    model = torch.nn.Linear(3, 1)
    before = model.weight.detach().clone()
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    model(torch.tensor([[float("inf"), 1.0, 1.0]])).sum().backward()
    grad_norm, stepped = clip_grad_norm_and_step(model, optimizer, max_grad_norm=1.0)
    assert not stepped and not math.isfinite(grad_norm)
    assert torch.equal(model.weight, before)
    assert model.weight.grad is None


def test_gradient_is_clipped_to_the_max_norm_before_the_step():
    model = torch.nn.Linear(1, 1, bias=False)
    model.weight.data.fill_(0.0)
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    (model(torch.tensor([[10.0]])).sum()).backward()  # grad = 10
    grad_norm, stepped = clip_grad_norm_and_step(model, optimizer, max_grad_norm=2.0)
    assert stepped and grad_norm == pytest.approx(10.0)
    assert model.weight.item() == pytest.approx(-2.0, rel=1e-5)


def test_a_resumed_optimizer_takes_the_configs_peak_lr_and_weight_decay_at_its_place_in_the_schedule(
    tiny_model_path, one_rank_gloo_group, tmp_path
):
    """The scheduler and optimizer state of a checkpoint carry the peak lr of the run that saved them: a run resumed
    with another worker.actor.optim.lr trained on at the old one without a word (as in EasyR1 and verl)."""
    from easyrl.config import load_config
    from easyrl.testing.single_rank import build_actor
    from easyrl.trainer.checkpoint import warn_of_config_changes
    from easyrl.workers.fsdp_checkpoint import load_role_checkpoint, save_role_checkpoint

    def built(lr: float, weight_decay: float):
        overrides = [f"worker.actor.optim.lr={lr}", f"worker.actor.optim.weight_decay={weight_decay}"]
        overrides += ["worker.actor.optim.lr_warmup_steps=4"]
        _, module, optimizer = build_actor(str(tiny_model_path), overrides, batch_size=1)
        optim_config = load_config(overrides, validate=False).worker.actor.optim
        return module, optimizer, build_lr_scheduler(optimizer, optim_config, "worker.actor.optim")

    module, optimizer, scheduler = built(1e-3, 0.01)
    for _ in range(2):  # two steps of warmup: lr = peak x 3/4 from here
        optimizer.step()
        scheduler.step()
    assert optimizer.param_groups[0]["lr"] == pytest.approx(1e-3 * 3 / 4)
    save_role_checkpoint(str(tmp_path / "actor"), module, optimizer, scheduler)

    module, optimizer, scheduler = built(1e-3, 0.01)
    assert load_role_checkpoint(str(tmp_path / "actor"), module, optimizer, scheduler) == []
    assert optimizer.param_groups[0]["lr"] == pytest.approx(1e-3 * 3 / 4)

    module, optimizer, scheduler = built(4e-3, 0.1)
    changes = load_role_checkpoint(str(tmp_path / "actor"), module, optimizer, scheduler)
    assert changes == [("lr", 1e-3, 4e-3), ("weight_decay", 0.01, 0.1)]
    for group in optimizer.param_groups:
        assert group["lr"] == pytest.approx(4e-3 * 3 / 4) and group["weight_decay"] == 0.1
    assert scheduler.get_last_lr()[0] == pytest.approx(4e-3 * 3 / 4)
    optimizer.step()
    scheduler.step()
    assert optimizer.param_groups[0]["lr"] == pytest.approx(4e-3)  # warmup done, at the new peak

    records = []
    handler = logging.Handler()
    handler.emit = records.append
    logging.getLogger("easyrl.trainer.checkpoint").addHandler(handler)
    try:
        warn_of_config_changes([changes], "worker.actor.optim", 2)
    finally:
        logging.getLogger("easyrl.trainer.checkpoint").removeHandler(handler)
    assert [record.getMessage() for record in records][0] == (
        "worker.actor.optim.lr is 0.001 in the checkpoint of step 2 and 0.004 in this run's config: the config's "
        "applies from step 3 on (the peak: warmup and decay keep their place in the schedule)."
    )


def test_a_resume_with_a_longer_schedule_trains_its_next_step_at_the_new_schedules_lr_and_says_so(
    tiny_model_path, one_rank_gloo_group, tmp_path, caplog
):
    """A finished 8-step cosine run resumed with trainer.max_steps=10 trained step 9 at the old schedule's lr (0, its
    end), then followed the new one: a wasted step that looked normal, and nothing said."""
    from easyrl.config import load_config
    from easyrl.testing.single_rank import build_actor
    from easyrl.trainer.checkpoint import warn_of_config_changes
    from easyrl.workers.fsdp_checkpoint import load_role_checkpoint, save_role_checkpoint

    def built(steps: int):
        overrides = ["worker.actor.optim.lr=1e-3", "worker.actor.optim.lr_scheduler_type=cosine"]
        _, module, optimizer = build_actor(str(tiny_model_path), overrides, batch_size=1)
        optim_config = load_config(overrides, validate=False).worker.actor.optim
        optim_config.training_steps = steps  # what the trainer derives from trainer.max_steps
        return module, optimizer, build_lr_scheduler(optimizer, optim_config, "worker.actor.optim")

    module, optimizer, scheduler = built(8)
    for _ in range(8):
        optimizer.step()
        scheduler.step()
    assert optimizer.param_groups[0]["lr"] == 0.0  # the end of the cosine
    save_role_checkpoint(str(tmp_path / "actor"), module, optimizer, scheduler)

    module, optimizer, scheduler = built(10)
    changes = load_role_checkpoint(str(tmp_path / "actor"), module, optimizer, scheduler)
    fresh = 1e-3 * lr_multiplier(8, 0, 10, "cosine", 0.0)  # what a 10-step run trains its step 9 at
    assert fresh == pytest.approx(1e-3 * 0.5 * (1 + math.cos(0.8 * math.pi)))
    assert [group["lr"] for group in optimizer.param_groups] == [pytest.approx(fresh)] * len(optimizer.param_groups)
    assert scheduler.get_last_lr()[0] == pytest.approx(fresh)
    assert [name for name, _, _ in changes] == ["lr of the next step"] and changes[0][1] == 0.0
    with caplog.at_level(logging.WARNING, logger="easyrl.trainer.checkpoint"):
        warn_of_config_changes([changes], "worker.actor.optim", 8)
    said = f"step 9 trains at lr {fresh:.4g}, this run's schedule at its place, where the checkpoint's schedule would"
    assert f"{said} give 0;" in caplog.text
    module, optimizer, scheduler = built(8)  # the same schedule: nothing changes, nothing said
    assert load_role_checkpoint(str(tmp_path / "actor"), module, optimizer, scheduler) == []


def test_adamw_is_fused_on_cuda_parameters_only():
    """The fused kernel where every parameter is on CUDA (the GPU update); elsewhere PyTorch's default path, so CPU
    runs keep their numbers (the CPU suite's exact AdamW comparisons and bit-exact resumes)."""
    cpu = build_optimizer(torch.nn.Linear(2, 2), OptimConfig(), "worker.actor.optim")
    assert isinstance(cpu, torch.optim.AdamW) and not cpu.param_groups[0]["fused"]
    if torch.cuda.is_available():
        gpu = build_optimizer(torch.nn.Linear(2, 2).cuda(), OptimConfig(), "worker.actor.optim")
        assert gpu.param_groups[0]["fused"] is True


def test_a_resumed_optimizer_runs_the_step_kernel_of_this_device_not_of_the_run_that_saved_it(
    tiny_model_path, one_rank_gloo_group, tmp_path
):
    """A GPU run's optimizer state says fused=True (optim._adamw on CUDA); resumed on a CPU, it keeps the CPU's own
    choice, silently: which kernel runs the step is the device's business, not a setting the config changed."""
    from easyrl.testing.single_rank import build_actor
    from easyrl.workers.fsdp_checkpoint import load_role_checkpoint, save_role_checkpoint

    _, module, optimizer = build_actor(str(tiny_model_path), ["worker.actor.optim.lr=1e-3"], batch_size=1)
    optimizer.param_groups[0]["fused"] = True  # as a checkpoint written on a GPU holds it
    save_role_checkpoint(str(tmp_path / "actor"), module, optimizer, None)

    _, module, optimizer = build_actor(str(tiny_model_path), ["worker.actor.optim.lr=1e-3"], batch_size=1)
    assert not optimizer.param_groups[0]["fused"]
    assert load_role_checkpoint(str(tmp_path / "actor"), module, optimizer, None) == []
    assert not optimizer.param_groups[0]["fused"]
