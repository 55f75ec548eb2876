"""vLLM rollout inside the FSDP worker (hybrid engine) on Ray + gloo, fp32, against plain Hugging Face models.

Every comparison is with a FRESHLY loaded HF model of the worker's current weights (``save_hf_model``), so a sync
that silently kept old weights (e.g. a stale tied lm_head) cannot pass.
"""

from contextlib import contextmanager

import pytest
import torch

import easyrl  # noqa: F401  (process environment before Ray starts)
from easyrl.workers.fsdp_worker import FSDPWorker
from easyrl.workers.rollout.base import GenerationRequest, rollout_logprob_mismatch
from tests.fsdp_helpers import load_hf_causal_lm, worker_group
from tests.rollout_helpers import (
    RESPONSE_LENGTH,
    hf_greedy_responses,
    make_prompts,
    response_lists,
    rollout_worker_config,
    update_actor_once,
)


# fp32 engine vs fp32 actor: measured differences are ~1e-5 (different kernels, same math)
LOGPROB_TOLERANCE = 1e-4
GREEDY = GenerationRequest(sampling_override={"temperature": 0.0})


@contextmanager
def _started(model_path, n_workers: int, tensor_parallel_size: int = 1):
    config = rollout_worker_config(model_path, n_workers, tensor_parallel_size=tensor_parallel_size)
    with worker_group(
        FSDPWorker, config, "actor_rollout", name_prefix="rollout", process_group_timeout_s=240, processes=n_workers
    ) as group:
        group.init_model()
        yield group


@pytest.fixture(scope="module", params=["tied", "untied"])
def one_worker(request, ray_cluster):
    """One actor_rollout worker on the tied (qwen2) or untied (llama) tiny model."""
    model_fixture = {"tied": "tiny_model_path", "untied": "tiny_untied_model_path"}[request.param]
    with _started(request.getfixturevalue(model_fixture), 1) as group:
        yield group


@pytest.fixture(scope="module")
def tensor_parallel_pair(ray_cluster, tiny_model_path):
    """Two workers forming ONE vLLM engine with tensor_parallel_size=2."""
    with _started(tiny_model_path, 2, tensor_parallel_size=2) as group:
        yield group


@pytest.fixture(scope="module")
def data_parallel_pair(ray_cluster, tiny_model_path):
    """Two workers, each its own vLLM engine (tensor_parallel_size=1): two data-parallel rollout ranks."""
    with _started(tiny_model_path, 2, tensor_parallel_size=1) as group:
        yield group


def _current_hf_model(group, path):
    group.save_hf_model(str(path))
    return load_hf_causal_lm(path)


@pytest.mark.timeout(300)
def test_vllm_greedy_equals_hf_greedy_on_the_same_weights(one_worker, tokenizer, tmp_path):
    prompts = make_prompts(tokenizer)
    out = one_worker.generate_sequences(prompts, GREEDY)
    expected = hf_greedy_responses(_current_hf_model(one_worker, tmp_path / "hf"), prompts, tokenizer.eos_token_id)
    assert response_lists(out) == expected


@pytest.mark.timeout(300)
def test_vllm_follows_the_actor_after_an_update(one_worker, tokenizer, tmp_path):
    prompts = make_prompts(tokenizer)
    before = response_lists(one_worker.generate_sequences(prompts, GREEDY))
    update_actor_once(one_worker, seed=1)
    after = one_worker.generate_sequences(prompts, GREEDY)
    expected = hf_greedy_responses(_current_hf_model(one_worker, tmp_path / "hf"), prompts, tokenizer.eos_token_id)
    assert expected != before  # the update changed the greedy answers, so stale weights would fail below
    assert response_lists(after) == expected
    assert after.meta_info["metrics"]["rollout/weight_sync_s"] > 0


@pytest.mark.timeout(300)
def test_rollout_log_probs_match_the_actor_log_probs(one_worker, tokenizer):
    # sampled and scored at the worker's rollout.temperature (the actor always scores at that temperature)
    out = one_worker.generate_sequences(make_prompts(tokenizer), GenerationRequest(sampling_override={"n": 2}))
    actor = one_worker.compute_log_probs(out).batch["old_log_probs"]
    mismatch = rollout_logprob_mismatch(actor, out.batch["rollout_log_probs"], out.batch["response_mask"])
    print(f"rollout vs actor log-prob |diff|: {mismatch}")
    assert mismatch["rollout/logprob_abs_diff/max"] < LOGPROB_TOLERANCE


@pytest.mark.timeout(300)
def test_a_call_seed_reproduces_the_samples(one_worker, tokenizer):
    prompts, two = make_prompts(tokenizer), {"n": 2}
    seeded = GenerationRequest(sampling_override=two, seed=[7, 0, 3, 0])
    first, again = (response_lists(one_worker.generate_sequences(prompts, seeded)) for _ in range(2))
    unseeded = response_lists(one_worker.generate_sequences(prompts, GenerationRequest(sampling_override=two)))
    assert first == again
    assert unseeded != first


@pytest.mark.timeout(300)
def test_n_samples_give_interleaved_rows_with_consistent_masks(one_worker, tokenizer):
    prompts = make_prompts(tokenizer)
    out = one_worker.generate_sequences(prompts, GenerationRequest(sampling_override={"n": 3, "temperature": 1.0}))
    batch, rows, prompt_length = out.batch, 3 * len(prompts), prompts.batch["input_ids"].shape[1]
    assert batch["responses"].shape == (rows, RESPONSE_LENGTH)
    assert batch["input_ids"].shape == (rows, prompt_length + RESPONSE_LENGTH)
    assert torch.equal(batch["prompts"], prompts.batch["input_ids"].repeat_interleave(3, dim=0))
    assert torch.equal(batch["input_ids"][:, prompt_length:], batch["responses"])
    assert torch.equal(batch["attention_mask"][:, prompt_length:], batch["response_mask"])
    mask = batch["response_mask"].bool()
    assert (batch["responses"][~mask] == tokenizer.pad_token_id).all()
    assert (batch["rollout_log_probs"][~mask] == 0).all() and (batch["rollout_log_probs"][mask] <= 0).all()
    steps = torch.diff(batch["position_ids"][:, prompt_length - 1 :], dim=-1)
    assert (steps == 1).all()
    assert list(out.non_tensor_batch["raw_prompt_ids"][3:6]) == [prompts.non_tensor_batch["raw_prompt_ids"][1]] * 3
    assert out.meta_info["metrics"]["rollout/gen_tokens_per_s"] > 0


@pytest.mark.timeout(420)
def test_tensor_parallel_engine_matches_hf_before_and_after_an_update(tensor_parallel_pair, tokenizer, tmp_path):
    prompts = make_prompts(tokenizer)
    out = tensor_parallel_pair.generate_sequences(prompts, GREEDY)
    hf_model = _current_hf_model(tensor_parallel_pair, tmp_path / "before")
    assert response_lists(out) == hf_greedy_responses(hf_model, prompts, tokenizer.eos_token_id)

    update_actor_once(tensor_parallel_pair, seed=2)
    out = tensor_parallel_pair.generate_sequences(prompts, GREEDY)
    hf_model = _current_hf_model(tensor_parallel_pair, tmp_path / "after")
    assert response_lists(out) == hf_greedy_responses(hf_model, prompts, tokenizer.eos_token_id)
    # sampling stays in lockstep across the two ranks of the engine (same seed), else the ranks would hang
    sampled = tensor_parallel_pair.generate_sequences(prompts, GenerationRequest(sampling_override={"n": 2}))
    assert sampled.batch["responses"].shape == (2 * len(prompts), RESPONSE_LENGTH)


@pytest.mark.timeout(300)
def test_data_parallel_engines_split_the_prompts_and_sample_with_different_seeds(
    data_parallel_pair, tokenizer, tmp_path
):
    prompts = make_prompts(tokenizer, texts=["Tell me a story about a cat"] * 4)
    out = data_parallel_pair.generate_sequences(prompts, GenerationRequest(sampling_override={"n": 1}))
    rows = response_lists(out)
    assert len(rows) == 4  # rows 0-1 sampled by engine 0, rows 2-3 by engine 1
    assert rows[0] != rows[1] and rows[0] != rows[2] and rows[1] != rows[3]

    greedy = make_prompts(tokenizer)
    hf_model = _current_hf_model(data_parallel_pair, tmp_path / "hf")
    assert response_lists(data_parallel_pair.generate_sequences(greedy, GREEDY)) == hf_greedy_responses(
        hf_model, greedy, tokenizer.eos_token_id
    )


def test_the_engine_reads_the_actors_override_config(tiny_model_path):
    """worker.actor.model.override_config reaches the engine as vLLM's hf_overrides (its own EngineArgs builds the
    model config here, without starting an engine): it runs the model the actor trains, e.g. with a longer context."""
    from vllm.engine.arg_utils import EngineArgs

    from easyrl.config import RolloutConfig
    from easyrl.workers.rollout.vllm_rollout import _cpu_engine_environment, _engine_kwargs

    config = RolloutConfig(prompt_length=8, response_length=8)
    kwargs = _engine_kwargs(config, 1, 0, hf_overrides={"max_position_embeddings": 4321})
    with _cpu_engine_environment():
        model_config = EngineArgs(model=str(tiny_model_path), **kwargs).create_model_config()
        assert model_config.hf_config.max_position_embeddings == 4321
        plain = EngineArgs(model=str(tiny_model_path), **_engine_kwargs(config, 1, 0)).create_model_config()
        assert plain.hf_config.max_position_embeddings != 4321


def test_a_head_size_without_a_cpu_kernel_is_refused_naming_the_model_and_the_way_out(tiny_model_path, tmp_path):
    """vLLM's CPU attention has kernels for some head sizes only; a model with another one (16 here) started its engine
    and failed at the first generation deep in a Ray traceback. The engine's own model config gives the head size."""
    from vllm.engine.arg_utils import EngineArgs

    from easyrl.config import RolloutConfig
    from easyrl.testing.tiny_models import build_tiny_causal_lm
    from easyrl.workers.rollout.vllm_rollout import _cpu_engine_environment, _engine_kwargs, check_cpu_head_size

    narrow = build_tiny_causal_lm(tmp_path / "narrow", hidden_size=32, num_heads=2)
    kwargs = _engine_kwargs(RolloutConfig(prompt_length=8, response_length=8), 1, 0)
    with _cpu_engine_environment():
        head_sizes = [EngineArgs(model=str(path), **kwargs).create_model_config().get_head_size() for path in (
            tiny_model_path, narrow)]  # fmt: skip
    assert head_sizes == [32, 16]
    check_cpu_head_size(32, str(tiny_model_path), "rollout engine", "Set worker.rollout.name=hf")  # has a kernel
    with pytest.raises(ValueError) as refused:
        check_cpu_head_size(16, str(narrow), "rollout engine", "Set worker.rollout.name=hf")
    assert str(refused.value).startswith(
        f"The rollout engine (vLLM on CPU) cannot run {narrow}: its attention heads have 16 dimensions, and vLLM's CPU "
        "attention has kernels for [32, 64,"
    )
    assert str(refused.value).endswith(
        "Set worker.rollout.name=hf, or use a model whose head size is one of those (a GPU runs it)."
    )


def test_a_killed_jobs_segment_under_this_port_is_removed_before_the_rank_creates_its_own(monkeypatch, tmp_path):
    """vLLM's CPU tensor-parallel communicator creates one shared-memory segment per rank, named after the job's
    MASTER_PORT; a SIGKILLed job leaves its segments behind, and a later job given the same port failed with
    "create shm in SHMManager failed. errno: 17". Each rank removes its own stale one first, and only its own."""
    from types import SimpleNamespace

    from vllm.distributed.device_communicators import cpu_communicator

    from easyrl.workers.rollout import vllm_rollout

    vllm_rollout._job_unique_cpu_shm_names()
    monkeypatch.setattr(vllm_rollout, "SHM_FOLDER", str(tmp_path))
    monkeypatch.setenv("MASTER_PORT", "65001")
    monkeypatch.setenv("VLLM_DIST_IDENT", "unset")  # restored after the test
    name = "easyrl65001-tp:0-[0-1]-cpushm"
    (tmp_path / f"{name}_1").write_bytes(b"stale")
    (tmp_path / f"{name}_0").write_bytes(b"rank 0's, live")
    communicator = SimpleNamespace(unique_name="tp:0", ranks=[0, 1], rank=1)
    assert cpu_communicator._CPUSHMDistributed.make_group_name(communicator) == name
    assert sorted(path.name for path in tmp_path.iterdir()) == [f"{name}_0"]
    assert cpu_communicator._CPUSHMDistributed.make_group_name(communicator) == name  # nothing to remove: fine
