"""Vision-language training on data shaped like users' own, end to end through `python -m easyrl train`.

The dataset (easyrl.testing.user_vl_data) mixes pictures of random sizes (16 px to 4k) and aspect ratios (up to 1:8),
many formats and PIL modes, rows with one picture, two pictures or none, the ``<image>`` placeholder written or left
out, paths relative to the data file and to data.image_dir, and one corrupt file. Each run trains 2 GRPO steps
(REINFORCE++ for n=1, which has no group) of a tiny random Qwen2.5-VL or Qwen3-VL on 2 FSDP2 workers with the vLLM
rollout, everything in fp32, and must report finite losses and actor log-probs equal to vLLM's on its own samples.

The full grid -- model x n in {1, 2, 5} x micro-batch in {1, 3} x padding-free on/off x reference on/off -- is slow;
the default suite runs two points that, with the reported setup at the end of this file, touch every value of every
axis and both models, and a third with PPO's critic (GAE) on the VLM. Each run is its own subprocess, as a user runs it.
"""

import itertools
import math
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.fixtures.trainer_runs import REPO_ROOT, WORD_START_REWARD, log_tail, metrics_by_step, run_training


RUN_TIMEOUT_S = 540
# actor vs vLLM log-prob of the sampled tokens, both fp32 (measured: ~1e-6 on these runs)
LOGPROB_TOLERANCE = 1e-3
ROLLOUT_BATCH = 6  # prompts per step: per device 3 x n samples, divisible by micro-batches of 1 and 3
FAMILIES = ("qwen2_5_vl", "qwen3_vl")


@dataclass(frozen=True)
class GridPoint:
    family: str
    n: int
    micro_batch: int
    padding_free: bool
    reference: bool
    dynamic_batching: bool = False
    critic: bool = False  # PPO with GAE: a value model of the same VLM

    @property
    def name(self) -> str:
        return (
            f"{self.family}-n{self.n}-mb{self.micro_batch}-{'pf' if self.padding_free else 'padded'}"
            f"-{'ref' if self.reference else 'noref'}{'-dyn' if self.dynamic_batching else ''}"
            f"{'-gae' if self.critic else ''}"
        )

    @property
    def estimator(self) -> str:
        return "gae" if self.critic else "reinforce_plus_plus" if self.n == 1 else "grpo"

    def overrides(self) -> list[str]:
        critic = [
            f"worker.critic.global_batch_size={ROLLOUT_BATCH}",
            f"worker.critic.micro_batch_size_per_device_for_update={self.micro_batch}",
            f"worker.critic.micro_batch_size_per_device_for_experience={self.micro_batch}",
            f"worker.critic.padding_free={str(self.padding_free).lower()}",
            f"worker.critic.shared_prefix={str(self.padding_free).lower()}",  # each prompt once per group
            "worker.critic.model.enable_gradient_checkpointing=false",
            "worker.critic.model.freeze_vision_tower=true",  # its own tower cache: the values pass serves the update
            "worker.critic.fsdp.torch_dtype=fp32",
            "worker.critic.fsdp.mp_param_dtype=fp32",
        ]
        return (critic if self.critic else []) + [
            f"algorithm.adv_estimator={self.estimator}",
            f"algorithm.disable_kl={str(not self.reference).lower()}",
            f"algorithm.use_kl_loss={str(self.reference).lower()}",
            f"worker.rollout.n={self.n}",
            f"worker.actor.micro_batch_size_per_device_for_update={self.micro_batch}",
            f"worker.actor.micro_batch_size_per_device_for_experience={self.micro_batch}",
            f"worker.actor.padding_free={str(self.padding_free).lower()}",
            f"worker.actor.dynamic_batching={str(self.dynamic_batching).lower()}",
        ]


# With the reported setup below (Qwen2.5-VL, n=2, micro-batches 2 / 4, padding-free, dynamic batching, KL in the
# reward with a reference), every value of every axis runs at least once in the default suite, on both models.
COVERING_POINTS = (
    GridPoint("qwen2_5_vl", n=1, micro_batch=1, padding_free=True, reference=True),
    GridPoint("qwen3_vl", n=5, micro_batch=3, padding_free=False, reference=False),
    # PPO's critic on the VLM, which transformers has no value-head class for (models/vision.use_value_head)
    GridPoint("qwen2_5_vl", n=2, micro_batch=3, padding_free=True, reference=False, critic=True),
)
FULL_GRID = tuple(
    GridPoint(family, n, micro_batch, padding_free, reference)
    for family, n, micro_batch, padding_free, reference in itertools.product(
        FAMILIES, (1, 2, 5), (1, 3), (True, False), (True, False)
    )
)


def user_data_overrides(data_file: Path, image_dir: Path, model_path: Path, save_dir: Path) -> list[str]:
    """A user's run: their jsonl, their picture folder, EasyR1's default pixel limits (262144 / 4194304, clamped
    into the tiny processors' own range), a reward scored in the driver that differs within every group from the
    first step (so that the update has a gradient to follow)."""
    return [
        f"data.train_files={data_file}",
        "data.val_files=",
        f"data.image_dir={image_dir}",
        "data.prompt_key=problem",
        "data.answer_key=answer",
        "data.image_key=images",
        f"data.format_prompt={REPO_ROOT / 'format_prompt' / 'r1v.jinja'}",
        "data.max_prompt_length=256",
        "data.max_response_length=16",
        f"data.rollout_batch_size={ROLLOUT_BATCH}",
        "data.seed=3",
        f"worker.actor.global_batch_size={ROLLOUT_BATCH}",
        f"worker.actor.model.model_path={model_path}",
        "worker.actor.model.enable_gradient_checkpointing=false",
        "worker.actor.optim.lr=1e-4",
        "worker.actor.fsdp.torch_dtype=fp32",
        "worker.actor.fsdp.mp_param_dtype=fp32",
        "worker.ref.fsdp.torch_dtype=fp32",
        "worker.ref.fsdp.mp_param_dtype=fp32",
        "worker.rollout.name=vllm",
        "worker.rollout.dtype=fp32",
        "worker.rollout.temperature=1.0",
        "worker.rollout.enforce_eager=true",
        "worker.rollout.kv_cache_memory_bytes=67108864",
        "worker.rollout.disable_tqdm=true",
        f"worker.reward.reward_function={WORD_START_REWARD}:compute_score",
        "worker.reward.num_cpus=0",
        "trainer.n_gpus_per_node=2",
        "trainer.max_steps=2",
        "trainer.val_before_train=false",
        "trainer.val_freq=-1",
        "trainer.save_freq=-1",
        f"trainer.save_checkpoint_path={save_dir}",
    ]


@pytest.fixture(scope="module")
def user_dataset(tmp_path_factory):
    from easyrl.testing.user_vl_data import write_user_dataset

    return write_user_dataset(tmp_path_factory.mktemp("user_vl_data"), num_rows=24, seed=7)


@pytest.fixture(scope="module")
def tiny_vlm_paths(tmp_path_factory) -> dict[str, Path]:
    from easyrl.testing.tiny_vlms import build_tiny_vlm

    root = tmp_path_factory.mktemp("user_vl_models")
    return {family: build_tiny_vlm(family, root / family) for family in FAMILIES}


def run_point(point: GridPoint, user_dataset, tiny_vlm_paths, root: Path) -> tuple[dict[int, dict], Path, float]:
    save_dir, log_path = root / "checkpoints", root / "train.log"
    args = user_data_overrides(user_dataset.data_file, user_dataset.image_dir, tiny_vlm_paths[point.family], save_dir)
    start = time.monotonic()
    run_training(args + point.overrides(), log_path, RUN_TIMEOUT_S)
    return metrics_by_step(save_dir), log_path, time.monotonic() - start


def check_run(point: GridPoint, metrics: dict[int, dict], log_path: Path, user_dataset) -> None:
    assert sorted(metrics) == [1, 2], f"{point.name}: steps logged {sorted(metrics)}\n{log_tail(log_path)}"
    for step, row in metrics.items():
        for name in ("actor/pg_loss", "actor/grad_norm", "actor/entropy", "reward/overall"):
            assert math.isfinite(row[name]), f"{point.name} step {step}: {name} = {row[name]}"
        assert row["actor/grad_norm"] > 0, f"{point.name} step {step}: no gradient reached the policy"
        if point.reference:
            assert math.isfinite(row["actor/kl_loss"]), f"{point.name} step {step}: kl_loss = {row['actor/kl_loss']}"
        if point.critic:
            assert math.isfinite(row["critic/vf_loss"]), f"{point.name} step {step}: vf_loss = {row['critic/vf_loss']}"
            assert row["critic/grad_norm"] > 0, f"{point.name} step {step}: no gradient reached the critic"
            hits, misses = row["perf/critic_vision_cache_hits"], row["perf/critic_vision_cache_misses"]
            assert hits > 0 and misses > 0, f"{point.name} step {step}: critic cache {hits} hits, {misses} misses"
            if point.padding_free:
                shared = row["critic/shared_prefix/samples_per_prompt"]
                assert shared > 1, f"{point.name} step {step}: the critic's groups shared nothing ({shared})"
        diff = row["rollout/logprob_abs_diff/mean"]
        assert diff < LOGPROB_TOLERANCE, f"{point.name} step {step}: actor vs vLLM log-prob diff {diff}"
    # the corrupt picture's row was skipped, counted and named, and nothing else was
    log = Path(log_path).read_text(errors="replace")
    total = len(user_dataset.rows)
    assert f"skipped 1 of {total} rows" in log and f"row {user_dataset.corrupt_row}:" in log


@pytest.mark.timeout(RUN_TIMEOUT_S + 120)
@pytest.mark.parametrize(
    "point",
    # the first point's path (one sample, micro-batches of one, a reference) is in the full grid too: slow here
    [pytest.param(point, marks=pytest.mark.slow) if i == 0 else point for i, point in enumerate(COVERING_POINTS)],
    ids=lambda point: point.name,
)
def test_two_steps_on_user_pictures_train_and_match_vllm(point, user_dataset, tiny_vlm_paths, tmp_path):
    metrics, log_path, _ = run_point(point, user_dataset, tiny_vlm_paths, tmp_path)
    check_run(point, metrics, log_path, user_dataset)


@pytest.mark.slow
@pytest.mark.timeout(RUN_TIMEOUT_S + 120)
@pytest.mark.parametrize("point", FULL_GRID, ids=lambda point: point.name)
def test_full_grid_on_user_pictures(point, user_dataset, tiny_vlm_paths, tmp_path):
    metrics, log_path, _ = run_point(point, user_dataset, tiny_vlm_paths, tmp_path)
    check_run(point, metrics, log_path, user_dataset)


# ----------------------------------------------------------------------------------------------------------------------
# the reported setup
# ----------------------------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def red_dots_dataset(tmp_path_factory) -> Path:
    """24 rows of 112x112 RGB PNGs with 1-4 red dots, read through data.image_dir, as in the report."""
    import json
    import random

    from PIL import Image, ImageDraw

    root = tmp_path_factory.mktemp("red_dots")
    (root / "img").mkdir()
    rng = random.Random(0)
    rows = []
    for i in range(24):
        picture = Image.new("RGB", (112, 112), "white")
        draw = ImageDraw.Draw(picture)
        dots = rng.randint(1, 4)
        for _ in range(dots):
            x, y = rng.randint(5, 95), rng.randint(5, 95)
            draw.ellipse([x, y, x + 10, y + 10], fill="red")
        picture.save(root / "img" / f"{i}.png")
        rows.append(
            {
                "problem": "<image>How many red dots are in the picture?",
                "answer": str(dots),
                "images": [f"img/{i}.png"],
            }
        )
    (root / "data.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    return root


@pytest.mark.timeout(RUN_TIMEOUT_S + 120)
def test_the_reported_setup_trains_with_the_default_kl_settings(red_dots_dataset, tmp_path):
    """The report: a tiny random Qwen2.5-VL whose processor keeps 56x56 to 224x224 pixels, data.min/max_pixels the
    same, rollout batch 8 x n=2, micro-batches 2 (update) / 4 (experience), 2 workers, vLLM, an r1v sequential
    reward, default KL settings. It failed at step 1 in the actor's build_vision_inputs."""
    from easyrl.testing.tiny_vlms import build_tiny_vlm, set_pixel_limits

    model_path = set_pixel_limits(build_tiny_vlm("qwen2_5_vl", tmp_path / "model"), 56 * 56, 224 * 224)
    save_dir, log_path = tmp_path / "checkpoints", tmp_path / "train.log"
    args = [
        f"data.train_files={red_dots_dataset / 'data.jsonl'}",
        f"data.image_dir={red_dots_dataset}",
        "data.prompt_key=problem",
        f"data.format_prompt={REPO_ROOT / 'format_prompt' / 'r1v.jinja'}",
        "data.min_pixels=3136",
        "data.max_pixels=50176",
        "data.max_prompt_length=256",
        "data.max_response_length=24",
        "data.rollout_batch_size=8",
        "worker.actor.global_batch_size=8",
        "worker.rollout.n=2",
        "worker.actor.micro_batch_size_per_device_for_update=2",
        "worker.actor.micro_batch_size_per_device_for_experience=4",
        "trainer.n_gpus_per_node=2",
        "worker.rollout.name=vllm",
        "worker.rollout.enforce_eager=true",
        f"worker.actor.model.model_path={model_path}",
        f"worker.reward.reward_function={REPO_ROOT / 'reward_function' / 'r1v.py'}:compute_score",
        "worker.reward.num_cpus=0",
        # what a CPU machine needs (fp32 for exact log-probs, a KV cache of a size that fits), nothing else
        "worker.actor.fsdp.torch_dtype=fp32",
        "worker.actor.fsdp.mp_param_dtype=fp32",
        "worker.ref.fsdp.torch_dtype=fp32",
        "worker.ref.fsdp.mp_param_dtype=fp32",
        "worker.rollout.dtype=fp32",
        "worker.rollout.kv_cache_memory_bytes=67108864",
        "worker.rollout.disable_tqdm=true",
        "trainer.max_steps=2",
        "trainer.val_freq=-1",
        "trainer.save_freq=-1",
        f"trainer.save_checkpoint_path={save_dir}",
    ]
    run_training(args, log_path, RUN_TIMEOUT_S)
    metrics = metrics_by_step(save_dir)
    assert sorted(metrics) == [1, 2]
    for step, row in metrics.items():
        assert math.isfinite(row["actor/pg_loss"]) and math.isfinite(row["actor/entropy"]), (step, row)
        assert row["rollout/logprob_abs_diff/mean"] < LOGPROB_TOLERANCE, (step, row["rollout/logprob_abs_diff/mean"])


@pytest.mark.timeout(RUN_TIMEOUT_S + 120)
def test_chat_messages_that_carry_their_pictures_train_and_match_vllm(red_dots_dataset, tiny_vlm_paths, tmp_path):
    """The same pictures given the way Qwen's and OpenAI's chat formats give them: inside the messages, as
    {"type": "image", "image": path} and {"type": "image_url", "image_url": {"url": "data:image/png;base64,..."}},
    with no image column. The actor and vLLM must both see them (equal log-probs)."""
    import base64
    import json

    rows = []
    for i, line in enumerate((red_dots_dataset / "data.jsonl").read_text().splitlines()):
        original = json.loads(line)
        path = red_dots_dataset / original["images"][0]
        if i % 2:
            url = "data:image/png;base64," + base64.b64encode(path.read_bytes()).decode()
            picture = {"type": "image_url", "image_url": {"url": url}, "image": None}
        else:
            picture = {"type": "image", "image": str(path), "image_url": None}
        text = {"type": "text", "text": "How many red dots are in the picture?", "image": None, "image_url": None}
        rows.append({"prompt": [{"role": "user", "content": [picture, text]}], "answer": original["answer"]})
    data_file = tmp_path / "messages.jsonl"
    data_file.write_text("".join(json.dumps(row) + "\n" for row in rows))
    save_dir, log_path = tmp_path / "checkpoints", tmp_path / "train.log"
    args = user_data_overrides(data_file, tmp_path, tiny_vlm_paths["qwen2_5_vl"], save_dir) + [
        "data.prompt_key=prompt",
        "data.format_prompt=",
        "worker.rollout.n=2",
        "trainer.n_gpus_per_node=1",
        "worker.rollout.tensor_parallel_size=1",
        "trainer.max_steps=2",
    ]
    run_training(args, log_path, RUN_TIMEOUT_S)
    rows = metrics_by_step(save_dir)
    assert sorted(rows) == [1, 2]
    # step 2 samples from the weights the first update made and synced: on one worker and busy cores the engine's
    # reload once ran on one thread and vLLM's log-probs then stood 0.36-0.43 from the actor's
    for step, row in rows.items():
        assert math.isfinite(row["actor/pg_loss"]) and row["actor/grad_norm"] > 0, (step, row)
        assert row["rollout/logprob_abs_diff/mean"] < LOGPROB_TOLERANCE, (step, row["rollout/logprob_abs_diff/mean"])
    assert "cannot be used" not in log_path.read_text(errors="replace")  # no row was skipped
