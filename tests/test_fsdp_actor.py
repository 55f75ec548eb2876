"""FSDP2 actor and reference workers on Ray + gloo (1 and 2 workers), checked against one plain process."""

import os

import pytest
import torch

import easyrl  # noqa: F401  (process environment before Ray starts)
from easyrl.workers.fsdp_worker import FSDPWorker
from tests.fsdp_helpers import (
    add_policy_targets,
    load_hf_causal_lm,
    make_batch,
    padded_policy_loss,
    per_sequence_log_probs,
    worker_config,
    worker_group,
)


LR = 0.1


def _group(model_path, n_workers: int, role: str):
    config = worker_config(model_path, n_workers, lr=LR)
    return worker_group(FSDPWorker, config, role, name_prefix=role, processes=n_workers)


@pytest.fixture(scope="module")
def two_workers(ray_cluster, tiny_model_path):
    with _group(tiny_model_path, 2, "actor_ref") as group:
        yield group


@pytest.fixture(scope="module")
def one_worker(ray_cluster, tiny_model_path):
    with _group(tiny_model_path, 1, "actor") as group:
        yield group


@pytest.fixture(scope="module")
def hf_model(tiny_model_path):
    return load_hf_causal_lm(tiny_model_path)


def _weight_buckets(worker) -> list[list[tuple[str, torch.Tensor]]]:
    return [[(name, tensor.clone()) for name, tensor in bucket] for bucket in worker.iter_full_params_per_layer()]


def _sgd_reference(model_path, data, actor_config) -> dict[str, torch.Tensor]:
    """One SGD step of a plain model on the whole batch: theta - lr * grad(L_minibatch)."""
    model = load_hf_causal_lm(model_path)
    padded_policy_loss(model, data, actor_config).backward()
    with torch.no_grad():
        for param in model.parameters():
            param -= LR * param.grad
    return model.state_dict()


# ----------------------------------------------------------------------------------------------------------------------
# initialisation and log-probs
# ----------------------------------------------------------------------------------------------------------------------
@pytest.mark.timeout(300)
def test_rank0_broadcast_init_gives_the_checkpoint_weights(two_workers, hf_model):
    two_workers.init_model()
    state = two_workers.get_full_state_dict()
    expected = hf_model.state_dict()
    assert set(state) == set(expected)
    for name, tensor in expected.items():
        assert torch.equal(state[name], tensor), name


@pytest.mark.timeout(300)
@pytest.mark.parametrize("group_name", ["one_worker", "two_workers"])
def test_actor_log_probs_equal_plain_hf_forward(group_name, request, hf_model):
    group = request.getfixturevalue(group_name)
    group.init_model()
    data = make_batch(batch_size=6, seed=1)
    out = group.compute_log_probs(data)
    expected = per_sequence_log_probs(hf_model, data, temperature=0.7)
    torch.testing.assert_close(out.batch["old_log_probs"], expected, atol=1e-5, rtol=0)


@pytest.mark.timeout(300)
def test_reference_starts_equal_to_actor_and_ignores_actor_updates(two_workers):
    two_workers.init_model()
    data = make_batch(batch_size=6, seed=2)
    ref_before = two_workers.compute_ref_log_probs(data).batch["ref_log_probs"]
    actor_before = two_workers.compute_log_probs(data).batch["old_log_probs"]
    torch.testing.assert_close(ref_before, actor_before, atol=1e-6, rtol=0)

    two_workers.update_actor(add_policy_targets(data, actor_before))
    ref_after = two_workers.compute_ref_log_probs(data).batch["ref_log_probs"]
    actor_after = two_workers.compute_log_probs(data).batch["old_log_probs"]
    assert torch.equal(ref_after, ref_before)
    assert (actor_after - actor_before).abs().max() > 1e-3


# ----------------------------------------------------------------------------------------------------------------------
# updates
# ----------------------------------------------------------------------------------------------------------------------
@pytest.mark.timeout(300)
@pytest.mark.parametrize("group_name", ["one_worker", "two_workers"])
def test_sgd_update_equals_one_process_update_on_the_whole_batch(group_name, request, tiny_model_path):
    group = request.getfixturevalue(group_name)
    group.init_model()
    data = make_batch(batch_size=6, seed=3)
    data = add_policy_targets(data, group.compute_log_probs(data).batch["old_log_probs"], seed=3)
    # 3 samples per worker with micro-batches of 2 (2 + 1), rows of unequal length: exercises the global denominator
    metrics = group.update_actor(data).meta_info["metrics"]
    assert metrics["actor/nonfinite_grad_skipped_steps"] == 0

    config = worker_config(tiny_model_path, 1).actor
    expected = _sgd_reference(tiny_model_path, data, config)
    state = group.get_full_state_dict()
    before = load_hf_causal_lm(tiny_model_path).state_dict()
    assert max((state[k] - before[k]).abs().max() for k in state) > 1e-3  # the step really moved the weights
    for name, tensor in expected.items():
        torch.testing.assert_close(state[name], tensor, atol=1e-6, rtol=0, msg=name)


@pytest.mark.timeout(300)
def test_non_finite_gradient_norm_skips_the_step_and_reports_it(two_workers):
    two_workers.init_model()
    before = two_workers.get_full_state_dict()
    data = make_batch(batch_size=6, seed=4)
    data = add_policy_targets(data, two_workers.compute_log_probs(data).batch["old_log_probs"])
    data.batch["advantages"][0, 0] = float("nan")
    metrics = two_workers.update_actor(data).meta_info["metrics"]
    assert metrics["actor/nonfinite_grad_skipped_steps"] == 1
    after = two_workers.get_full_state_dict()
    for name, tensor in before.items():
        assert torch.equal(after[name], tensor), name


# ----------------------------------------------------------------------------------------------------------------------
# checkpoints and export
# ----------------------------------------------------------------------------------------------------------------------
@pytest.mark.timeout(300)
def test_dcp_checkpoint_restores_the_sharded_weights_exactly(two_workers, tmp_path):
    two_workers.init_model()
    data = make_batch(batch_size=6, seed=5)
    data = add_policy_targets(data, two_workers.compute_log_probs(data).batch["old_log_probs"])
    two_workers.update_actor(data)
    saved = two_workers.get_full_state_dict()
    two_workers.save_checkpoint(str(tmp_path))
    two_workers.update_actor(data)
    assert not torch.equal(two_workers.get_full_state_dict()["lm_head.weight"], saved["lm_head.weight"])

    two_workers.load_checkpoint(str(tmp_path))
    restored = two_workers.get_full_state_dict()
    for name, tensor in saved.items():
        assert torch.equal(restored[name], tensor), name
    assert os.path.isfile(tmp_path / "huggingface" / "config.json")


@pytest.mark.timeout(300)
def test_hf_export_reloads_with_the_trained_log_probs(two_workers, tmp_path):
    two_workers.init_model()
    data = make_batch(batch_size=6, seed=6)
    data = add_policy_targets(data, two_workers.compute_log_probs(data).batch["old_log_probs"])
    two_workers.update_actor(data)
    two_workers.save_hf_model(str(tmp_path / "hf"))
    trained = two_workers.compute_log_probs(data).batch["old_log_probs"]
    reloaded = load_hf_causal_lm(tmp_path / "hf")
    assert reloaded.lm_head.weight.data_ptr() == reloaded.model.embed_tokens.weight.data_ptr()  # still tied
    torch.testing.assert_close(per_sequence_log_probs(reloaded, data, 0.7), trained, atol=1e-5, rtol=0)


@pytest.mark.timeout(300)
def test_offline_merge_of_a_dcp_checkpoint_equals_the_live_weights(two_workers, tmp_path):
    from easyrl.workers.fsdp_checkpoint import merge_checkpoint_to_hf

    two_workers.init_model()
    data = make_batch(batch_size=6, seed=11)
    data = add_policy_targets(data, two_workers.compute_log_probs(data).batch["old_log_probs"])
    two_workers.update_actor(data)
    two_workers.save_checkpoint(str(tmp_path / "ckpt"))
    live = two_workers.get_full_state_dict()

    merge_checkpoint_to_hf(str(tmp_path / "ckpt"), str(tmp_path / "merged"))
    merged = load_hf_causal_lm(tmp_path / "merged").state_dict()
    for name, tensor in live.items():
        assert torch.equal(merged[name], tensor), name
    assert os.path.isfile(tmp_path / "merged" / "tokenizer.json")


# ----------------------------------------------------------------------------------------------------------------------
# weight streaming for the rollout engine
# ----------------------------------------------------------------------------------------------------------------------
@pytest.mark.timeout(300)
def test_weight_buckets_hold_one_decoder_layer_each_then_the_rest(two_workers, hf_model):
    two_workers.init_model()
    rank0, rank1 = two_workers.apply_all(_weight_buckets)
    num_layers = hf_model.config.num_hidden_layers
    assert len(rank0) == num_layers + 1
    for layer, bucket in enumerate(rank0[:num_layers]):
        assert all(name.startswith(f"model.layers.{layer}.") for name, _ in bucket)
    expected = dict(hf_model.named_parameters())  # the tied head appears once, as the embedding
    streamed = dict(pair for bucket in rank0 for pair in bucket)
    assert streamed.keys() == expected.keys()
    for name, tensor in expected.items():
        assert torch.equal(streamed[name], tensor), name
    assert all(torch.equal(a[1], b[1]) for x, y in zip(rank0, rank1) for a, b in zip(x, y))


@pytest.mark.timeout(300)
def test_folders_written_from_a_released_model_are_bf16_and_keep_its_generation_config(
    ray_cluster, tiny_model_path, tmp_path, caplog
):
    # a model released in bf16 (as most hub models are): training keeps fp32 master weights, and transformers then
    # reports fp32 in the live config; the checkpoint's config, `easyrl merge` and the SFT export say and write bf16.
    # Its generation_config.json (an instruct model's: two stop ids, sampling defaults) is carried to each folder:
    # a model rebuilt from config.json alone would get one stop id and no sampling defaults, and vLLM serving the
    # merged folder would sample differently from the released model and run past <|endoftext|>.
    import json
    import logging
    import shutil

    import safetensors.torch
    from transformers import GenerationConfig

    from easyrl.trainer.merge import merge_checkpoint

    bf16_path = tmp_path / "bf16-model"
    shutil.copytree(tiny_model_path, bf16_path)
    released = load_hf_causal_lm(tiny_model_path).to(torch.bfloat16)
    eos = released.config.eos_token_id
    released.generation_config = GenerationConfig(
        bos_token_id=released.config.bos_token_id,
        eos_token_id=[eos, eos + 1],
        do_sample=True,
        temperature=0.7,
        top_p=0.8,
        top_k=20,
        repetition_penalty=1.05,
    )
    released.save_pretrained(bf16_path)
    assert json.loads((bf16_path / "config.json").read_text())["dtype"] == "bfloat16"
    generation_keys = ("eos_token_id", "do_sample", "temperature", "top_p", "top_k", "repetition_penalty")
    released_generation = {key: getattr(released.generation_config, key) for key in generation_keys}

    with worker_group(FSDPWorker, worker_config(str(bf16_path), 1, lr=LR), "actor", name_prefix="bf16") as group:
        group.init_model()
        data = make_batch(batch_size=6, seed=12)
        group.update_actor(add_policy_targets(data, group.compute_log_probs(data).batch["old_log_probs"]))
        live = group.get_full_state_dict()
        assert live["lm_head.weight"].dtype == torch.float32
        group.save_checkpoint(str(tmp_path / "ckpt"))
        group.save_hf_model(str(tmp_path / "export"))

    assert json.loads((tmp_path / "ckpt" / "huggingface" / "config.json").read_text())["dtype"] == "bfloat16"
    for folder, dtype in (
        (tmp_path / "export", None),
        (merge_checkpoint(str(tmp_path / "ckpt"), str(tmp_path / "merged")), None),
        (
            merge_checkpoint(str(tmp_path / "ckpt"), str(tmp_path / "merged32"), dtype="fp32"),
            "float32",
        ),  # the config's spelling
    ):
        tensors = safetensors.torch.load_file(os.path.join(folder, "model.safetensors"))
        assert json.loads(open(os.path.join(folder, "config.json")).read())["dtype"] == (dtype or "bfloat16")
        for name, tensor in live.items():
            if name in tensors:  # the tied head is stored once
                expected = tensor if dtype == "float32" else tensor.to(torch.bfloat16)
                assert torch.equal(tensors[name], expected), (folder, name)
        assert "model.embed_tokens.weight" in tensors
    for folder in (tmp_path / "ckpt" / "huggingface", tmp_path / "export", tmp_path / "merged", tmp_path / "merged32"):
        written = GenerationConfig.from_pretrained(folder)
        assert {key: getattr(written, key) for key in generation_keys} == released_generation, folder

    # a checkpoint written before the generation config was kept: merged with the defaults, and the user is told
    (tmp_path / "ckpt" / "huggingface" / "generation_config.json").unlink()
    with caplog.at_level(logging.WARNING, logger="easyrl.workers.fsdp_checkpoint"):
        merged = merge_checkpoint(str(tmp_path / "ckpt"), str(tmp_path / "merged_old"))
    assert GenerationConfig.from_pretrained(merged).eos_token_id == eos
    assert "holds no generation_config.json" in caplog.text and "copy that model's" in caplog.text
