"""A tiny random Qwen3-VL in two FSDP2 workers on Ray + gloo (fp32): the image-text-to-text class loads with its
processor, log-probs of a mixed media batch equal a plain HF forward, the frozen vision tower stays put through an
update, and the weight stream gives every vision block its own bucket.
"""

import pytest
import torch

import easyrl  # noqa: F401  (process environment before Ray starts)
from easyrl.testing.vl_batch import VLSample, make_vl_batch, random_image, random_video, reference_log_probs
from easyrl.workers.fsdp_worker import FSDPWorker
from tests.fixtures.vl import LOG_PROB_TOLERANCE
from tests.fsdp_helpers import add_policy_targets, worker_config, worker_group


SAMPLES = [
    VLSample("Count the shapes.", images=[random_image(0)]),
    VLSample("Hello there, how are you?"),
    VLSample("Which picture is brighter?", images=[random_image(1), random_image(2, width=84, height=56)]),
    VLSample("What happens?", videos=[random_video(3)]),
]


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    from easyrl.testing.tiny_vlms import build_tiny_vlm

    return build_tiny_vlm("qwen3_vl", tmp_path_factory.mktemp("qwen3_vl"))


@pytest.fixture(scope="module")
def hf_setup(model_path):
    """(processor, plain HF model, mixed batch with temperature 1)."""
    from transformers import AutoModelForImageTextToText, AutoProcessor

    processor = AutoProcessor.from_pretrained(model_path)
    model = AutoModelForImageTextToText.from_pretrained(model_path, dtype=torch.float32, attn_implementation="sdpa")
    return processor, model, make_vl_batch(processor, str(model_path), SAMPLES, response_length=6, seed=2)


@pytest.fixture(scope="module")
def two_workers(ray_cluster, model_path):
    config = worker_config(model_path, 2, lr=0.1, global_batch_size=4, micro_batch_size=1)
    config.actor.model.freeze_vision_tower = True
    with worker_group(FSDPWorker, config, "actor_ref", name_prefix="vl_actor", processes=2) as group:
        group.init_model()
        yield group


def _bucket_names(worker) -> list[list[str]]:
    return [[name for name, _ in bucket] for bucket in worker.iter_full_params_per_layer()]


def _model_class_and_processor(worker) -> tuple[str, str]:
    return type(worker.actor_module).__name__, type(worker.processor).__name__


@pytest.mark.timeout(300)
def test_workers_load_the_image_text_to_text_model_with_its_processor_and_weights(two_workers, hf_setup):
    (model_class, processor_class), _ = two_workers.apply_all(_model_class_and_processor)
    assert model_class == "FSDPQwen3VLForConditionalGeneration"
    assert processor_class == "Qwen3VLProcessor"
    state = two_workers.get_full_state_dict()
    expected = hf_setup[1].state_dict()
    assert set(state) == set(expected)
    for name, tensor in expected.items():
        assert torch.equal(state[name], tensor), name


@pytest.mark.timeout(300)
def test_two_workers_log_probs_equal_plain_hf_forward_on_a_mixed_media_batch(two_workers, hf_setup, model_path):
    processor, model, data = hf_setup
    out = two_workers.compute_log_probs(data)
    # workers score at the run's rollout temperature (the config's), whatever the batch says
    temperature = worker_config(model_path, 2).rollout.temperature
    expected = reference_log_probs(model, processor, SAMPLES, data, temperature=temperature)
    torch.testing.assert_close(out.batch["old_log_probs"], expected, **LOG_PROB_TOLERANCE)
    ref = two_workers.compute_ref_log_probs(data)
    torch.testing.assert_close(ref.batch["ref_log_probs"], expected, **LOG_PROB_TOLERANCE)


@pytest.mark.timeout(300)
def test_frozen_vision_tower_stays_put_while_the_language_model_learns(two_workers, hf_setup):
    data = hf_setup[2]
    before = two_workers.get_full_state_dict()
    data = add_policy_targets(data, two_workers.compute_log_probs(data).batch["old_log_probs"], seed=1)
    metrics = two_workers.update_actor(data).meta_info["metrics"]
    assert metrics["actor/nonfinite_grad_skipped_steps"] == 0
    # the frozen tower's outputs of the log-prob pass served the update (worker.actor.model.vision_cache_mb)
    assert metrics["perf/vision_cache_hits"] > 0
    after = two_workers.get_full_state_dict()
    vision = [name for name in before if name.startswith("model.visual.")]
    language = [name for name in before if name.startswith("model.language_model.layers.")]
    assert vision and language
    assert all(torch.equal(after[name], before[name]) for name in vision)
    assert max((after[name] - before[name]).abs().max() for name in language) > 1e-3


@pytest.mark.timeout(300)
def test_weight_stream_gives_each_vision_block_and_decoder_layer_its_own_bucket(two_workers, hf_setup):
    rank0, _ = two_workers.apply_all(_bucket_names)
    config = hf_setup[1].config
    prefixes = [f"model.visual.blocks.{i}." for i in range(config.vision_config.depth)]
    prefixes += [f"model.language_model.layers.{i}." for i in range(config.text_config.num_hidden_layers)]
    for prefix in prefixes:
        (bucket,) = [b for b in rank0 if b[0].startswith(prefix)]
        assert all(name.startswith(prefix) for name in bucket)
    tower_rest = [b for b in rank0 if b[0].startswith("model.visual.") and "blocks" not in b[0]]
    assert len(tower_rest) == 1 and all(name.startswith("model.visual.") for name in tower_rest[0])
    streamed = [name for bucket in rank0 for name in bucket]
    assert sorted(streamed) == sorted(name for name, _ in hf_setup[1].named_parameters())
