"""The critic role on two workers with hybrid sharding (fsdp_size=1: every rank holds a full replica)."""

import pytest
import torch

import easyrl  # noqa: F401  (process environment before Ray starts)
from easyrl.workers.fsdp_worker import FSDPWorker
from tests.fsdp_helpers import make_batch, worker_config, worker_group


@pytest.fixture(scope="module")
def critic_workers(ray_cluster, tiny_untied_model_path):
    config = worker_config(tiny_untied_model_path, 2, strategy="adamw", lr=1e-3, fsdp_size=1)
    config.critic.padding_free = True
    with worker_group(FSDPWorker, config, "critic", name_prefix="critic", processes=2) as group:
        group.init_model()
        yield group


def _local_critic_weights(worker) -> dict[str, torch.Tensor]:
    """This rank's own copy of every critic parameter (a full replica under fsdp_size=1)."""
    return {name: param.to_local().detach().clone() for name, param in worker.critic_module.named_parameters()}


def _value_targets(data, values):
    gen = torch.Generator().manual_seed(0)
    mask = data.batch["response_mask"]
    data.batch["values"] = values
    data.batch["returns"] = torch.randn(mask.shape, generator=gen) * mask
    return data


@pytest.mark.timeout(300)
def test_critic_values_equal_a_plain_token_classification_forward(critic_workers, tiny_untied_model_path):
    from transformers import AutoModelForTokenClassification

    data = make_batch(batch_size=6, seed=9)
    values = critic_workers.compute_values(data).batch["values"]
    model = AutoModelForTokenClassification.from_pretrained(
        tiny_untied_model_path, num_labels=1, dtype=torch.float32, attn_implementation="sdpa"
    )
    model.load_state_dict(critic_workers.get_full_state_dict("critic"))
    batch = data.batch
    response_length = batch["responses"].shape[-1]
    with torch.no_grad():
        out = model(
            input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], position_ids=batch["position_ids"]
        )
    expected = out.logits[:, -response_length - 1 : -1, 0] * batch["response_mask"]
    torch.testing.assert_close(values, expected, atol=1e-5, rtol=0)


@pytest.mark.timeout(300)
def test_critic_updates_lower_the_value_loss_and_keep_replicas_identical(critic_workers):
    data = make_batch(batch_size=6, seed=10)
    data = _value_targets(data, critic_workers.compute_values(data).batch["values"])
    losses = [critic_workers.update_critic(data).meta_info["metrics"]["critic/vf_loss"] for _ in range(3)]
    assert losses[2] < losses[0]
    rank0, rank1 = critic_workers.apply_all(_local_critic_weights)
    assert rank0.keys() == rank1.keys()
    for name, tensor in rank0.items():
        assert torch.equal(rank1[name], tensor), name
    assert rank0["score.weight"].shape == (1, 64)  # each rank holds the whole parameter, not a shard


@pytest.mark.timeout(300)
def test_a_merged_critic_checkpoint_is_a_token_classification_model_with_the_trained_values(critic_workers, tmp_path):
    # `easyrl merge --local_dir .../critic`: the value model as a Hugging Face folder (a one-label token
    # classification head over the language model), giving the trained critic's values
    from transformers import AutoConfig, AutoModelForTokenClassification

    from easyrl.trainer.merge import merge_checkpoint

    data = make_batch(batch_size=6, seed=11)
    critic_workers.update_critic(_value_targets(data, critic_workers.compute_values(data).batch["values"]))
    values = critic_workers.compute_values(data).batch["values"]
    critic_workers.save_checkpoint(str(tmp_path / "critic"))
    merged = merge_checkpoint(str(tmp_path / "critic"))

    config = AutoConfig.from_pretrained(merged)
    assert len(config.architectures) == 1 and config.architectures[0].endswith("ForTokenClassification")
    assert config.num_labels == 1
    assert not (tmp_path / "critic" / "huggingface" / "generation_config.json").exists()  # a critic does not generate
    model = AutoModelForTokenClassification.from_pretrained(merged, dtype=torch.float32, attn_implementation="sdpa")
    batch = data.batch
    response_length = batch["responses"].shape[-1]
    with torch.no_grad():
        out = model(
            input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], position_ids=batch["position_ids"]
        )
    torch.testing.assert_close(
        out.logits[:, -response_length - 1 : -1, 0] * batch["response_mask"], values, atol=1e-5, rtol=0
    )


def test_the_value_head_has_no_dropout_and_unknown_overrides_are_set_and_named(tiny_untied_model_path, caplog):
    """transformers applies only the config keys its class declares: `classifier_dropout` (read by the token
    classification head with getattr) was dropped, and the critic trained with 10% dropout before its value head."""
    from transformers import AutoModelForTokenClassification

    from easyrl.config import ModelConfig
    from easyrl.workers.fsdp_utils import load_hf_config

    model = ModelConfig(
        model_path=str(tiny_untied_model_path), override_config={"attention_dropout": 0.0, "my_flag": 3}
    )
    config = load_hf_config(model, "value")
    assert config.num_labels == 1 and config.classifier_dropout == 0.0
    assert config.my_flag == 3
    assert "worker.critic.model.override_config: my_flag is not among LlamaConfig's declared fields" in caplog.text
    assert "attention_dropout" not in caplog.text  # a declared field: applied by transformers
    head_dropout = AutoModelForTokenClassification.from_config(config).dropout
    assert head_dropout.p == 0.0
