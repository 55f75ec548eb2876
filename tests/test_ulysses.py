"""Ulysses sequence parallelism (models/ulysses.py): ulysses_size 2 computes what ulysses_size 1 computes.

The equality tests run two gloo ranks (plain torch.distributed processes: they start in seconds, Ray is not needed
for the numbers) with a tiny grouped-query model (4 query heads, 2 key/value heads) sharded by FSDP2 over both
ranks, fp32, on a packed batch of uneven lengths. Reference: ulysses 1, each rank scoring half the batch (plain data
parallelism). Ulysses 2: both ranks get the whole batch and split every packed row between them.
"""

import os
import socket
import time
import traceback

import pytest
import torch

from easyrl.models import ulysses


TIMEOUT_S = 240


# ----------------------------------------------------------------------------------------------------------------------
# layout (no processes)
# ----------------------------------------------------------------------------------------------------------------------
def _sp(rank: int, size: int = 2) -> ulysses.SequenceParallel:
    return ulysses.SequenceParallel(group=None, size=size, rank=rank)


def test_packed_row_is_padded_to_the_group_and_cut_in_contiguous_slices():
    # 11 tokens over 2 ranks: padded to 12, slices [0, 6) and [6, 12); kept positions 2, 5 on rank 0, 6, 9 on 1
    kept = torch.tensor([2, 5, 6, 9])
    first, second = ulysses.plan_slice(11, kept, _sp(0)), ulysses.plan_slice(11, kept, _sp(1))
    assert first.padded_tokens == second.padded_tokens == 12
    assert (first.start, first.end, second.start, second.end) == (0, 6, 6, 12)
    assert first.counts == second.counts == [2, 2]
    assert first.keep.tolist() == [2, 5] and second.keep.tolist() == [0, 3]
    assert (first.rows, second.rows) == (slice(0, 2), slice(2, 4))


def test_padding_is_a_sequence_of_its_own_with_positions_from_zero():
    ids = torch.tensor([[7, 8, 9, 4, 5]])
    positions = torch.tensor([[0, 1, 2, 0, 1]])
    cu_seqlens = torch.tensor([0, 3, 5], dtype=torch.int32)
    ids, positions, cu_seqlens = ulysses.pad_packed_row(ids, positions, cu_seqlens, 8, pad_id=0)
    assert ids.tolist() == [[7, 8, 9, 4, 5, 0, 0, 0]]
    assert positions.tolist() == [[0, 1, 2, 0, 1, 0, 1, 2]]
    assert cu_seqlens.tolist() == [0, 3, 5, 8]


def test_sequence_parallel_group_shares_one_dispatch_chunk():
    # 4 ranks, ulysses 2: ranks 0, 1 take chunk 0 of 2 and rank 0 answers; ranks 2, 3 take chunk 1
    layout = [ulysses.dispatch_layout(rank, 4, 2) for rank in range(4)]
    assert layout == [(0, 2, True), (0, 2, False), (1, 2, True), (1, 2, False)]


def test_pictures_are_shared_over_the_group_by_patch_count():
    # patches 64, 16, 512 (a video), 16: the video alone on rank 0, the pictures on rank 1 (96 patches)
    from easyrl.models.vision_encoder import balance_items

    assert balance_items([64, 16, 512, 16], 2) == [[2], [0, 1, 3]]
    # fewer items than ranks: the last rank gets none (it encodes a blank picture to keep the collectives in step)
    assert balance_items([64], 2) == [[0], []]
    assert balance_items([], 2) == [[], []]
    # equal loads: alternate, each rank's items in their original order
    assert balance_items([4, 4, 4, 4], 2) == [[0, 2], [1, 3]]


def test_heads_not_divisible_by_ulysses_size_name_the_key_and_the_counts():
    from transformers import Qwen2Config

    # fewer key/value heads than ranks is fine when the ranks are a multiple of them (each is repeated)
    for heads, kv_heads, size in [(4, 2, 2), (4, 2, 4), (16, 2, 8), (4, 1, 2)]:
        ulysses.check_heads(Qwen2Config(num_attention_heads=heads, num_key_value_heads=kv_heads), size, "key")
    config = Qwen2Config(num_attention_heads=6, num_key_value_heads=2)
    with pytest.raises(ValueError, match=r"worker\.actor\.ulysses_size.*6 attention heads.*one of 1, 2, 6\.$"):
        ulysses.check_heads(config, 4, "worker.actor.ulysses_size")
    config = Qwen2Config(num_attention_heads=12, num_key_value_heads=4)
    with pytest.raises(ValueError, match=r"12 attention heads and 4 key/value heads.*one of 1, 2, 4, 12\.$"):
        ulysses.check_heads(config, 6, "worker.actor.ulysses_size")
    # the suggestion is what the run can use: a size must divide the workers too (it suggested 3 for 2 workers, which
    # the next check refused)
    config = Qwen2Config(num_attention_heads=9, num_key_value_heads=3)
    with pytest.raises(ValueError, match=r"Of the sizes the heads allow \(1, 3, 9\), 1 also divides the 2 workers\.$"):
        ulysses.check_heads(config, 2, "worker.actor.ulysses_size", world_size=2)
    with pytest.raises(ValueError, match=r"Of the sizes the heads allow \(1, 3, 9\), 1, 3 also divide the 6 workers"):
        ulysses.check_heads(config, 2, "worker.actor.ulysses_size", world_size=6)


def test_easyrl_train_refuses_ulysses_the_model_heads_cannot_split_before_ray(tmp_path):
    from easyrl.config.plan import load_run_plan
    from easyrl.testing.tiny_models import build_tiny_causal_lm
    from easyrl.trainer.main import prepare_run_data
    from tests.fixtures.configs import driver_args

    path = build_tiny_causal_lm(tmp_path / "model", hidden_size=96, num_heads=3, num_kv_heads=1)
    args = [*driver_args(tmp_path, path, workers=2), "worker.actor.ulysses_size=2"]
    with pytest.raises(
        ValueError,
        match=r"`worker\.actor\.ulysses_size` is 2.*3 attention heads.*allow \(1, 3\), 1 also divides the 2",
    ):
        prepare_run_data(load_run_plan(args))
    assert len(prepare_run_data(load_run_plan([*args, "worker.actor.ulysses_size=1"])).train_loader) == 2
    # a tensor-parallel engine splits the heads by the same rule: it failed at engine start, after Ray
    tensor_parallel = [*args, "worker.actor.ulysses_size=1", "worker.rollout.tensor_parallel_size=2"]
    with pytest.raises(
        ValueError, match=r"`worker\.rollout\.tensor_parallel_size` is 2, but vLLM splits the attention"
    ):
        prepare_run_data(load_run_plan(tensor_parallel))
    # the critic's heads too, from its own model when it has one
    critic = [
        "algorithm.adv_estimator=gae",
        "worker.critic.ulysses_size=2",
        "worker.critic.global_batch_size=4",
        "worker.critic.padding_free=true",
    ]
    with pytest.raises(ValueError, match=r"`worker\.critic\.ulysses_size` is 2.*3 attention heads"):
        prepare_run_data(load_run_plan([*args, "worker.actor.ulysses_size=1", *critic]))
    even = build_tiny_causal_lm(tmp_path / "critic", hidden_size=96, num_heads=4, num_kv_heads=2)
    own = [*args, "worker.actor.ulysses_size=1", *critic, f"worker.critic.model.model_path={even}"]
    assert len(prepare_run_data(load_run_plan(own)).train_loader) == 2


def test_an_actor_on_a_model_with_odd_heads_refuses_ulysses_2_at_start(tmp_path):
    # the head counts live in the model's config: the worker finds them when it builds the actor
    from transformers import AutoModelForCausalLM

    from easyrl.config import ActorConfig
    from easyrl.testing.tiny_models import build_tiny_causal_lm
    from easyrl.workers.actor import Actor

    path = build_tiny_causal_lm(tmp_path, hidden_size=96, num_heads=3, num_kv_heads=1)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="sdpa")
    with pytest.raises(
        ValueError, match=r"`worker\.actor\.ulysses_size` is 2.*3 attention heads and 1 key/value heads"
    ):
        Actor(ActorConfig(use_torch_compile=False), model, sp=_sp(0))
    assert model.config._attn_implementation == "sdpa"  # left as it was


# ----------------------------------------------------------------------------------------------------------------------
# check (before Ray)
# ----------------------------------------------------------------------------------------------------------------------
def test_check_accepts_ulysses_2_on_2_workers_and_the_reference_follows_the_actor(valid_args):
    from easyrl.config.plan import load_run_plan

    plan = load_run_plan([*valid_args, "worker.actor.ulysses_size=2"])
    assert plan.config.worker.actor.ulysses_size == 2 and plan.config.worker.ref.ulysses_size == 2


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            ["worker.actor.ulysses_size=4"],
            r"`worker\.actor\.ulysses_size` \(4\) must divide the number of workers \(2",
        ),
        (
            ["worker.actor.ulysses_size=2", "worker.actor.padding_free=false"],
            r"`worker\.actor\.ulysses_size` is 2.*set worker\.actor\.padding_free=true",
        ),
        (
            ["algorithm.adv_estimator=gae", "worker.critic.global_batch_size=4", "worker.critic.ulysses_size=2"],
            r"`worker\.critic\.ulysses_size` is 2.*set worker\.critic\.padding_free=true",
        ),
    ],
    ids=["not-a-divisor-of-the-workers", "actor-padded", "critic-padded"],
)
def test_check_refuses_ulysses_it_cannot_run_naming_the_key(valid_args, overrides, message):
    from easyrl.config import ConfigError
    from easyrl.config.plan import load_run_plan

    with pytest.raises(ConfigError, match=message):
        load_run_plan([*valid_args, *overrides])


# ----------------------------------------------------------------------------------------------------------------------
# two ranks: ulysses 2 == ulysses 1
# ----------------------------------------------------------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _run_two_ranks(fn, *args) -> None:
    """Run ``fn(rank, *args)`` on two gloo ranks; fail on an error in either or after TIMEOUT_S."""
    import torch.multiprocessing as mp

    port = _free_port()
    context = mp.start_processes(_entry, (port, fn, args), nprocs=2, join=False, start_method="spawn")
    deadline = time.monotonic() + TIMEOUT_S
    try:
        while not context.join(timeout=2):
            if time.monotonic() > deadline:
                pytest.fail(f"the two ranks did not finish within {TIMEOUT_S} s")
    finally:
        for process in context.processes:
            if process.is_alive():
                process.kill()


def _entry(rank: int, port: int, fn, args) -> None:
    import torch.distributed as dist

    import easyrl  # noqa: F401  (the torchvision shim, before transformers)

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE="2")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        fn(rank, *args)
    except Exception:
        traceback.print_exc()
        raise
    finally:
        dist.destroy_process_group()


def _fsdp_model(path, kind: str, gradient_checkpointing: bool, lora_rank: int = 0):
    from torch.distributed.device_mesh import init_device_mesh
    from transformers import AutoModelForCausalLM, AutoModelForTokenClassification

    from easyrl.config import FSDPConfig
    from easyrl.workers.fsdp_utils import apply_fsdp2

    cls = AutoModelForCausalLM if kind == "causal_lm" else AutoModelForTokenClassification
    extra = {} if kind == "causal_lm" else {"num_labels": 1}
    torch.manual_seed(0)  # the value head is new: the same random head on both ranks and in both models
    model = cls.from_pretrained(path, dtype=torch.float32, attn_implementation="sdpa", **extra)
    if gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if lora_rank:
        from easyrl.config import LoraConfig
        from easyrl.models.lora import apply_lora

        model = apply_lora(model, LoraConfig(rank=lora_rank, alpha=2 * lora_rank), is_vision_language=False)
        with torch.no_grad():  # B starts at 0; a nonzero B makes the adapters change the outputs and A's gradients
            for name, param in model.named_parameters():
                if "lora_B" in name:
                    param.normal_(0.0, 0.05)
    mesh = init_device_mesh("cpu", (2,), mesh_dim_names=("fsdp",))
    apply_fsdp2(model.get_base_model() if lora_rank else model, mesh, FSDPConfig(mp_param_dtype="fp32"))
    return model


def _full_grads(model) -> dict[str, torch.Tensor]:
    return {name: p.grad.full_tensor().clone() for name, p in model.named_parameters() if p.grad is not None}


def _assert_close(actual: torch.Tensor, expected: torch.Tensor, what: str) -> None:
    scale = expected.abs().max().clamp(min=1e-12)
    error = float((actual - expected).abs().max() / scale)
    assert error <= 1e-5, f"{what}: relative error {error:.2e}"


def _whole_batch(*halves: torch.Tensor) -> list[torch.Tensor]:
    """Each rank's half of the batch (the ulysses 1 reference) -> the whole batch's, on every rank."""
    import torch.distributed as dist

    wholes = []
    for half in halves:
        parts = [torch.empty_like(half) for _ in range(2)]
        dist.all_gather(parts, half)
        wholes.append(torch.cat(parts))
    return wholes


def _fsdp_vl_model(path: str):
    from torch.distributed.device_mesh import init_device_mesh
    from transformers import AutoModelForImageTextToText

    from easyrl.config import FSDPConfig
    from easyrl.workers.fsdp_utils import apply_fsdp2

    module = AutoModelForImageTextToText.from_pretrained(path, dtype=torch.float32, attn_implementation="sdpa")
    apply_fsdp2(module, init_device_mesh("cpu", (2,), mesh_dim_names=("fsdp",)), FSDPConfig(mp_param_dtype="fp32"))
    return module


def _vl_scored(actor, batch) -> tuple[torch.Tensor, torch.Tensor]:
    """(log-probs, entropies) at temperature 0.8, after the backward pass of the update's token-mean loss."""
    from easyrl.workers.ppo_update import global_loss_denominator

    log_probs, entropy = actor._forward(batch, 0.8, calculate_entropy=True)
    mask = batch.batch["response_mask"]
    (-(log_probs * mask).sum() / global_loss_denominator(mask, "token-mean", dp_size=2)).backward()
    return log_probs.detach(), entropy.detach()


def _assert_same_numbers(mask, log_probs, entropy, model, ref_log_probs, ref_entropy, reference) -> None:
    """Log-probs and entropies at the response tokens, and every parameter's gradient, equal the reference's."""
    _assert_close(log_probs[mask], ref_log_probs[mask], "log-probs")
    _assert_close(entropy[mask], ref_entropy[mask], "entropy")
    expected, actual = _full_grads(reference), _full_grads(model)
    assert expected.keys() == actual.keys() and len(expected) > 5
    for name in expected:
        _assert_close(actual[name], expected[name], f"gradient of {name}")


def _actor_equality(rank: int, path: str, gradient_checkpointing: bool, lora_rank: int = 0) -> None:

    from easyrl.config import ActorConfig
    from easyrl.workers.actor import Actor
    from easyrl.workers.ppo_update import global_loss_denominator
    from tests.fsdp_helpers import make_batch

    data = make_batch(batch_size=6, prompt_length=9, response_length=7, seed=3)
    config = ActorConfig(padding_free=True, dynamic_batching=False, use_torch_compile=False)
    config.micro_batch_size_per_device_for_experience = 6
    sp = ulysses.build_sequence_parallel(2)
    assert sp is not None and sp.rank == rank

    def scored(actor, batch):
        log_probs, entropy = actor._forward(batch, 0.7, calculate_entropy=True)
        mask = batch.batch["response_mask"]
        # the update's token-mean: each rank's share over the world's tokens / world (ppo_update's denominator)
        denominator = global_loss_denominator(mask, "token-mean", dp_size=2)
        loss = -(log_probs * mask).sum() / denominator + 0.1 * (entropy * mask).sum() / denominator
        loss.backward()
        return log_probs.detach(), entropy.detach()

    # reference: ulysses 1, rank r scores half r of the batch
    reference = _fsdp_model(path, "causal_lm", gradient_checkpointing, lora_rank)
    half = data.chunk(2)[rank]
    ref_log_probs, ref_entropy = _whole_batch(*scored(Actor(config, reference), half))

    # ulysses 2: both ranks score the whole batch, each a half of every packed row
    model = _fsdp_model(path, "causal_lm", gradient_checkpointing, lora_rank)
    log_probs, entropy = scored(Actor(config, model, sp=sp), data)

    mask = data.batch["response_mask"].bool()
    _assert_close(log_probs[mask], ref_log_probs[mask], "log-probs")
    _assert_close(entropy[mask], ref_entropy[mask], "entropy")
    assert torch.equal(log_probs[~mask], torch.zeros_like(log_probs[~mask]))
    # dynamic batching: micro-batches by a token budget, identical on both ranks of the group (same samples)
    dynamic = ActorConfig(padding_free=True, dynamic_batching=True, use_torch_compile=False)
    dynamic.micro_batch_size_per_device_for_experience = 2
    dynamic_log_probs, _ = Actor(dynamic, model, sp=sp).compute_log_probs(data)
    _assert_close(dynamic_log_probs[mask], ref_log_probs[mask], "log-probs with dynamic batching")
    expected, actual = _full_grads(reference), _full_grads(model)
    assert expected.keys() == actual.keys() and len(expected) > 5
    for name in expected:
        _assert_close(actual[name], expected[name], f"gradient of {name}")


def _critic_equality(rank: int, path: str) -> None:
    import torch.distributed as dist

    from easyrl.config import CriticConfig
    from easyrl.workers.critic import Critic
    from tests.fsdp_helpers import make_batch

    data = make_batch(batch_size=4, prompt_length=8, response_length=5, seed=5)
    config = CriticConfig(padding_free=True, dynamic_batching=False)
    config.micro_batch_size_per_device_for_experience = 4
    sp = ulysses.build_sequence_parallel(2)
    reference = Critic(config, _fsdp_model(path, "value", False)).compute_values(data.chunk(2)[rank])
    gathered = [torch.empty_like(reference) for _ in range(2)]
    dist.all_gather(gathered, reference)
    values = Critic(config, _fsdp_model(path, "value", False), sp=sp).compute_values(data)
    mask = data.batch["response_mask"].bool()
    _assert_close(values[mask], torch.cat(gathered)[mask], "values")


def _shared_prefix_equality(rank: int, path: str, fused: bool) -> None:
    """Shared prefixes (a packed row holding each prompt once) cut over the Ulysses group give the unshared
    ulysses 1 numbers, with the groups' samples out of packed order (the row's outputs are read in another order)."""

    from easyrl.config import ActorConfig
    from easyrl.workers.actor import Actor
    from easyrl.workers.ppo_update import global_loss_denominator
    from tests.test_prefix_group import grouped_batch

    # groups A (3 samples), B (1), C (2), interleaved: A1 B1 A2 C1 A3 C2
    data = grouped_batch([3, 1, 2], prompt_length=9, response_length=7, seed=4)
    data.reorder(torch.tensor([0, 3, 1, 4, 2, 5]))
    sp = ulysses.build_sequence_parallel(2)

    def config(shared: bool) -> ActorConfig:
        actor = ActorConfig(padding_free=True, dynamic_batching=False, use_torch_compile=False, shared_prefix=shared)
        actor.micro_batch_size_per_device_for_experience = 6
        actor.model.use_fused_kernels = fused and shared
        return actor

    def scored(actor, batch):
        log_probs, entropy = actor._forward(batch, 0.7, calculate_entropy=True)
        mask = batch.batch["response_mask"]
        denominator = global_loss_denominator(mask, "token-mean", dp_size=2)
        (-(log_probs * mask).sum() / denominator + 0.1 * (entropy * mask).sum() / denominator).backward()
        return log_probs.detach(), entropy.detach()

    reference = _fsdp_model(path, "causal_lm", False)
    ref_log_probs, ref_entropy = _whole_batch(*scored(Actor(config(False), reference), data.chunk(2)[rank]))

    model = _fsdp_model(path, "causal_lm", False)
    actor = Actor(config(True), model, sp=sp)
    assert model.config._attn_implementation == ulysses.NAME  # Ulysses' wrapper, routing the layouts itself
    log_probs, entropy = scored(actor, data)
    assert (actor.prefix_stats.samples, actor.prefix_stats.groups) == (6, 3)
    assert actor.prefix_stats.tokens < actor.prefix_stats.unshared_tokens
    mask = data.batch["response_mask"].bool()
    _assert_same_numbers(mask, log_probs, entropy, model, ref_log_probs, ref_entropy, reference)
    assert torch.equal(log_probs[~mask], torch.zeros_like(log_probs[~mask]))


@pytest.fixture(scope="module")
def gqa_model_path(tmp_path_factory):
    """4 query heads, 2 key/value heads (head dim 32): ulysses 2 gives each rank 2 and 1."""
    from easyrl.testing.tiny_models import build_tiny_causal_lm

    return str(
        build_tiny_causal_lm(
            tmp_path_factory.mktemp("tiny_gqa"),
            hidden_size=128,
            num_heads=4,
            num_kv_heads=2,
            tie_word_embeddings=False,
        )
    )


def test_ulysses_2_log_probs_entropy_and_gradients_equal_ulysses_1(gqa_model_path):
    _run_two_ranks(_actor_equality, gqa_model_path, False)


def test_ulysses_2_equals_ulysses_1_with_one_key_value_head(tmp_path):
    """One key/value head for 4 query heads (Qwen2.5-VL-3B has 2 for 16, and runs ulysses 4 or 8): each rank gets
    a copy of it, and the copies' gradients add up to the head's."""
    from easyrl.testing.tiny_models import build_tiny_causal_lm

    path = build_tiny_causal_lm(tmp_path, hidden_size=128, num_heads=4, num_kv_heads=1, tie_word_embeddings=False)
    _run_two_ranks(_actor_equality, str(path), False)


@pytest.mark.parametrize("fused", [False, True], ids=["logits", "fused_head"])
def test_ulysses_2_with_shared_prefixes_equals_unshared_ulysses_1(gqa_model_path, fused):
    _run_two_ranks(_shared_prefix_equality, gqa_model_path, fused)


@pytest.mark.slow
def test_ulysses_2_equals_ulysses_1_with_gradient_checkpointing(gqa_model_path):
    _run_two_ranks(_actor_equality, gqa_model_path, True)


@pytest.mark.slow
def test_ulysses_2_equals_ulysses_1_with_lora_adapters(gqa_model_path):
    _run_two_ranks(_actor_equality, gqa_model_path, False, 4)


@pytest.mark.slow
def test_ulysses_2_critic_values_equal_ulysses_1(gqa_model_path):
    _run_two_ranks(_critic_equality, gqa_model_path)


# ----------------------------------------------------------------------------------------------------------------------
# vision-language: the vision tower's features go into the whole row, then the row (and its 3-D positions) is cut
# ----------------------------------------------------------------------------------------------------------------------
def _vl_samples():
    from easyrl.testing.vl_batch import VLSample, random_image, random_video

    return [
        VLSample("Count the shapes.", images=[random_image(0)]),
        VLSample("Hello there, how are you?"),
        VLSample("Which picture is brighter?", images=[random_image(1), random_image(2, width=84, height=56)]),
        VLSample("What happens?", videos=[random_video(3, frames=32)]),
    ]


def _vl_equality(rank: int, path: str) -> None:
    import torch.distributed as dist
    from transformers import AutoProcessor

    from easyrl.config import ActorConfig
    from easyrl.testing.vl_batch import make_vl_batch
    from easyrl.workers.actor import Actor

    processor = AutoProcessor.from_pretrained(path)
    data = make_vl_batch(processor, path, _vl_samples(), response_length=6, seed=1)
    data.meta_info["temperature"] = 0.8
    config = ActorConfig(padding_free=True, dynamic_batching=False, use_torch_compile=False)
    config.micro_batch_size_per_device_for_experience = 4
    sp = ulysses.build_sequence_parallel(2)

    scored = _vl_scored
    reference = _fsdp_vl_model(path)
    half = data.chunk(2)[rank]
    ref_log_probs, ref_entropy = _whole_batch(*scored(Actor(config, reference, processor=processor), half))
    ulysses_model = _fsdp_vl_model(path)
    encoded = _count_encoded_patches(ulysses_model)
    actor = Actor(config, ulysses_model, processor=processor, sp=sp)
    log_probs, entropy = scored(actor, data)
    mask = data.batch["response_mask"].bool()
    _assert_same_numbers(mask, log_probs, entropy, ulysses_model, ref_log_probs, ref_entropy, reference)
    assert any("visual" in name for name in _full_grads(reference)), "the vision tower got no gradient"

    # the group encoded the micro-batch's pictures and video once between them, each rank a share (by patches)
    grids = data.non_tensor_batch["multi_modal_data"]
    total = int(sum(int(g.prod()) for g in _grids(processor, grids)))
    both = [0, 0]
    dist.all_gather_object(both, sum(encoded))
    assert sum(both) == total and 0 < both[rank] < total, (both, total)
    # one sample per micro-batch: a picture (the other rank encodes a blank one), none, two pictures, the video
    single = ActorConfig(padding_free=True, dynamic_batching=False, use_torch_compile=False)
    single.micro_batch_size_per_device_for_experience = 1
    one_by_one, _ = Actor(single, ulysses_model, processor=processor, sp=sp).compute_log_probs(data)
    _assert_close(one_by_one[mask], ref_log_probs[mask], "log-probs, one sample per micro-batch")
    # gradients of a micro-batch with one picture: rank 1 encodes a blank picture whose rows are dropped, and its
    # tower still runs its backward (FSDP's gradient reduction needs every rank). Reference: both ranks score the
    # same sample at ulysses 1 (the FSDP average of two equal gradients)
    one = data.chunk(4)[0]
    reference.zero_grad(set_to_none=True)
    ulysses_model.zero_grad(set_to_none=True)
    scored(Actor(config, reference, processor=processor), one)
    scored(actor, one)
    expected, actual = _full_grads(reference), _full_grads(ulysses_model)
    assert any("visual" in name for name in actual), "the vision tower got no gradient"
    for name in expected:
        _assert_close(actual[name], expected[name], f"gradient of {name}, one picture")


def _vl_shared_prefix_equality(rank: int, path: str) -> None:
    """Shared prefixes over the Ulysses group on a VLM: each group's picture or video prompt runs once in the row
    (the tower encodes it once, shared over the ranks), the row is cut, and the numbers are the unshared ones."""
    import torch.distributed as dist
    from transformers import AutoProcessor

    from easyrl.config import ActorConfig
    from easyrl.testing.vl_batch import make_vl_batch
    from easyrl.workers.actor import Actor

    processor = AutoProcessor.from_pretrained(path)
    picture, text, _, video = _vl_samples()
    # groups interleaved: picture, video, picture, text, video, picture
    data = make_vl_batch(processor, path, [picture, video, picture, text, video, picture], response_length=6, seed=2)
    data.meta_info["temperature"] = 0.8

    def config(shared: bool) -> ActorConfig:
        actor = ActorConfig(padding_free=True, dynamic_batching=False, use_torch_compile=False, shared_prefix=shared)
        actor.micro_batch_size_per_device_for_experience = 6
        return actor

    reference = _fsdp_vl_model(path)
    half = data.chunk(2)[rank]
    ref_log_probs, ref_entropy = _whole_batch(*_vl_scored(Actor(config(False), reference, processor=processor), half))
    model = _fsdp_vl_model(path)
    encoded = _count_encoded_patches(model)
    actor = Actor(config(True), model, processor=processor, sp=ulysses.build_sequence_parallel(2))
    log_probs, entropy = _vl_scored(actor, data)
    assert (actor.prefix_stats.groups, actor.prefix_stats.unshared_rows) == (3, 0)
    mask = data.batch["response_mask"].bool()
    _assert_same_numbers(mask, log_probs, entropy, model, ref_log_probs, ref_entropy, reference)
    assert any("visual" in name for name in _full_grads(model)), "the vision tower got no gradient"
    # the picture and the video once each over the group (the unshared row holds 3 pictures and 2 videos)
    rows = data.non_tensor_batch["multi_modal_data"]
    once = sum(int(grid.prod()) for grid in _grids(processor, [rows[0], rows[1]]))
    both = [0, 0]
    dist.all_gather_object(both, sum(encoded))
    assert sum(both) == once, (both, once)


def _count_encoded_patches(model) -> list[int]:
    """Patches the vision tower's patch embedding takes, one entry per call (the tower's real work on this rank)."""
    from easyrl.models.vision import vision_tower

    calls: list[int] = []
    vision_tower(model).patch_embed.register_forward_pre_hook(lambda _, args: calls.append(int(args[0].shape[0])))
    return calls


def _grids(processor, rows) -> list[torch.Tensor]:
    from easyrl.models.vision import _pixels_once

    grids = []
    for row in rows:
        for kind in ("images", "videos"):
            items = list(row.get(kind) or []) if row else []
            if items:
                grids += [grid for _, grid in _pixels_once(processor, kind[:-1], items)]
    return grids


def _vl_model_path(family: str, root) -> str:
    """The tiny random ``family`` VLM with 2 key/value heads (2 query heads): one of each per rank at ulysses 2."""
    from transformers import AutoConfig, AutoModelForImageTextToText, AutoProcessor

    from easyrl.testing.tiny_vlms import build_tiny_vlm, save_random_model

    base = build_tiny_vlm(family, root / "base")
    config = AutoConfig.from_pretrained(base)
    config.text_config.num_key_value_heads = 2
    model_cls = AutoModelForImageTextToText._model_mapping[type(config)]
    return str(
        save_random_model(model_cls, config, root / "kv2", seed=0, processor=AutoProcessor.from_pretrained(base))
    )


@pytest.mark.slow
@pytest.mark.parametrize("family", ["qwen2_5_vl", "qwen3_vl"])
def test_ulysses_2_equals_ulysses_1_on_pictures_and_a_32_frame_video(family, tmp_path):
    _run_two_ranks(_vl_equality, _vl_model_path(family, tmp_path))


@pytest.mark.parametrize("family", ["qwen2_5_vl", "qwen3_vl"])
def test_ulysses_2_with_shared_prefixes_equals_unshared_ulysses_1_on_a_picture_and_a_video(family, tmp_path):
    _run_two_ranks(_vl_shared_prefix_equality, _vl_model_path(family, tmp_path))


# ----------------------------------------------------------------------------------------------------------------------
# a run through `easyrl train`
# ----------------------------------------------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_grpo_trains_three_steps_with_ulysses_2_through_easyrl_train(gqa_model_path, tmp_path):
    """2 workers, one Ulysses group: actor, reference (the actor's size) and log-prob passes split every row. The same
    run at ulysses 1 (2 data-parallel workers) samples the same first batch (same seeds, same weights), so step 1's
    loss, entropy and gradient norm must agree."""
    import math

    from tests.fixtures.trainer_runs import GRPO_RUN_OVERRIDES, metrics_by_step, run_training, train_args

    def run(size: int) -> dict[int, dict]:
        save_dir = tmp_path / f"ulysses_{size}"
        args = train_args(gqa_model_path, save_dir, GRPO_RUN_OVERRIDES) + [f"worker.actor.ulysses_size={size}"]
        run_training(args, tmp_path / f"train_{size}.log")
        return metrics_by_step(save_dir)

    metrics = run(2)
    assert {1, 2, 3} <= set(metrics), sorted(metrics)
    for step in (1, 2, 3):
        row = metrics[step]
        for key in ("actor/pg_loss", "actor/kl_loss", "actor/entropy", "actor/grad_norm"):
            assert math.isfinite(row[key]), (step, key, row[key])
        assert row["actor/grad_norm"] > 0.0
    # the KL to the reference starts at 0 (same weights, same slicing) and grows once the actor has moved
    assert metrics[1]["actor/kl_loss"] == pytest.approx(0.0, abs=1e-6)
    assert metrics[3]["actor/kl_loss"] > 0.0
    baseline = run(1)
    assert metrics[1]["response_length/mean"] == baseline[1]["response_length/mean"]  # the same samples
    for key in ("actor/pg_loss", "actor/entropy", "actor/grad_norm"):
        assert metrics[1][key] == pytest.approx(baseline[1][key], rel=1e-4, abs=1e-6), key
