"""PPO's critic on a vision-language model: tiny random Qwen2.5-VL / Qwen3-VL in one gloo process (fp32).

transformers has no VLM class with a value head, so the critic loads the image-text-to-text model and swaps its LM
head for a one-output head (models/vision.use_value_head). These tests hold its values to a plain per-sample
forward, check that they see the pictures, and that the update trains it.
"""

import dataclasses

import pytest
import torch

import easyrl  # noqa: F401  (torchvision shim before the Qwen-VL processors import it)
from easyrl.testing.vl_batch import make_vl_batch, random_image, reference_outputs
from tests.test_vl_actor import SAMPLES  # an image row, a text row, a two-image row and a video row


FAMILIES = ["qwen2_5_vl", "qwen3_vl"]


@pytest.fixture(scope="module", params=FAMILIES)
def vl_model(request, tmp_path_factory):
    from transformers import AutoProcessor

    from easyrl.testing.tiny_vlms import build_tiny_vlm

    path = build_tiny_vlm(request.param, tmp_path_factory.mktemp(request.param))
    return path, AutoProcessor.from_pretrained(path)


def _critic(path, processor, *, padding_free: bool, micro_batch_size: int = 2, shared_prefix: bool = False):
    from easyrl.config import CriticConfig, FSDPConfig, ModelConfig, OptimConfig
    from easyrl.workers.critic import Critic
    from easyrl.workers.fsdp_utils import build_device_mesh, build_fsdp_model
    from easyrl.workers.optim import build_optimizer

    config = CriticConfig(
        model=ModelConfig(model_path=str(path), enable_gradient_checkpointing=False),
        fsdp=FSDPConfig(torch_dtype="fp32", mp_param_dtype="fp32"),
        optim=OptimConfig(lr=1e-2, weight_decay=0.0),
        loss_avg_mode="token-mean",
    )
    config = dataclasses.replace(
        config,
        padding_free=padding_free,
        shared_prefix=shared_prefix,
        micro_batch_size_per_device_for_experience=micro_batch_size,
        micro_batch_size_per_device_for_update=micro_batch_size,
    )
    module = build_fsdp_model(
        config.model, config.fsdp, build_device_mesh(1, -1), kind="value", trainable=True, default_dtype=torch.float32
    )
    optimizer = build_optimizer(module, config.optim, "worker.critic.optim")
    return Critic(config, module, optimizer, mini_batch_size=len(SAMPLES), processor=processor), module


def _reference_values(path, processor, data) -> torch.Tensor:
    """(batch, response_len) values from a plain model of each sequence alone: the image-text-to-text model with the
    critic's head, as a user would load it."""
    from transformers import AutoModelForImageTextToText

    from easyrl.models.vision import use_value_head

    model = AutoModelForImageTextToText.from_pretrained(path, dtype=torch.float32, attn_implementation="sdpa")
    use_value_head(model)
    return reference_outputs(model, processor, SAMPLES, data, lambda logits, response: logits[:, 0])


@pytest.mark.timeout(240)
@pytest.mark.parametrize("padding_free", [False, True], ids=["padded", "padding_free"])
def test_vl_critic_values_equal_a_plain_forward_with_its_value_head(vl_model, one_rank_gloo_group, padding_free):
    path, processor = vl_model
    critic, module = _critic(path, processor, padding_free=padding_free)
    head = module.get_output_embeddings()
    embeddings = module.get_input_embeddings()
    assert head.weight.shape == (1, embeddings.weight.shape[-1])  # the tiny models tie their LM head: untied
    assert not module.config.get_text_config().tie_word_embeddings
    data = make_vl_batch(processor, str(path), SAMPLES, response_length=6, seed=1)
    values = critic.compute_values(data)
    expected = _reference_values(path, processor, data)
    assert values.abs().sum() > 0
    torch.testing.assert_close(values, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.timeout(240)
def test_vl_critic_sees_the_pictures_and_its_updates_lower_the_value_loss(vl_model, one_rank_gloo_group):
    path, processor = vl_model
    critic, module = _critic(path, processor, padding_free=True)
    data = make_vl_batch(processor, str(path), SAMPLES, response_length=6, seed=2)
    values = critic.compute_values(data)

    # another picture in the first row changes its values and no other row's
    repainted = make_vl_batch(processor, str(path), SAMPLES, response_length=6, seed=2)
    repainted.non_tensor_batch["multi_modal_data"][0] = {"images": [random_image(7)]}
    changed = critic.compute_values(repainted)
    mask = data.batch["response_mask"].bool()
    assert (changed[0] - values[0])[mask[0]].abs().max() > 1e-6
    torch.testing.assert_close(changed[1:], values[1:], atol=1e-6, rtol=0)

    generator = torch.Generator().manual_seed(0)
    data.batch["values"] = values
    data.batch["returns"] = torch.randn(values.shape, generator=generator) * mask
    tower_before = {n: p.detach().clone() for n, p in module.named_parameters() if "visual" in n}
    losses = [critic.update_critic(data)["critic/vf_loss"] for _ in range(4)]
    assert all(torch.isfinite(torch.tensor(losses)))
    assert losses[-1] < losses[0]
    moved = [n for n, p in module.named_parameters() if "visual" in n and not torch.equal(p.detach(), tower_before[n])]
    assert moved  # the pictures' encoder learns too (freeze_vision_tower is off)


@pytest.mark.timeout(240)
def test_vl_critic_resumes_from_its_checkpoint_and_merge_says_it_has_no_hf_folder(
    vl_model, one_rank_gloo_group, tmp_path
):
    from easyrl.trainer.merge import merge_checkpoint
    from easyrl.workers.fsdp_checkpoint import load_role_checkpoint, save_role_checkpoint

    path, processor = vl_model
    critic, module = _critic(path, processor, padding_free=True)
    data = make_vl_batch(processor, str(path), SAMPLES, response_length=6, seed=3)
    data.batch["values"] = critic.compute_values(data)
    data.batch["returns"] = torch.ones_like(data.batch["values"]) * data.batch["response_mask"]
    critic.update_critic(data)
    trained = critic.compute_values(data)
    save_role_checkpoint(str(tmp_path / "critic"), module, critic.optimizer, None, processor=processor)

    fresh, fresh_module = _critic(path, processor, padding_free=True)
    assert not torch.equal(fresh.compute_values(data), trained)
    load_role_checkpoint(str(tmp_path / "critic"), fresh_module, fresh.optimizer, None)
    torch.testing.assert_close(fresh.compute_values(data), trained, atol=0, rtol=0)

    with pytest.raises(ValueError, match="is the critic of a vision-language model: transformers has no class"):
        merge_checkpoint(str(tmp_path / "critic"))


@pytest.mark.timeout(240)
def test_vl_critic_values_with_shared_prefixes_equal_the_unshared_path(vl_model, one_rank_gloo_group):
    """worker.critic.shared_prefix: the samples of a prompt (and its pictures) computed once per group."""
    path, processor = vl_model
    samples = [SAMPLES[0], SAMPLES[0], SAMPLES[0], SAMPLES[1], SAMPLES[2], SAMPLES[2]]
    data = make_vl_batch(processor, str(path), samples, response_length=6, seed=4)
    plain, _ = _critic(path, processor, padding_free=True, micro_batch_size=3)
    shared, _ = _critic(path, processor, padding_free=True, micro_batch_size=3, shared_prefix=True)
    expected = plain.compute_values(data)
    torch.testing.assert_close(shared.compute_values(data), expected, rtol=1e-5, atol=1e-6)
    assert shared.prefix_stats.samples == len(samples) and shared.prefix_stats.groups == 3
