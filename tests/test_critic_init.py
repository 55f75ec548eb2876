"""The critic's value head, which a causal-LM checkpoint does not hold, is the same in every run of one config."""

import torch


def _value_head(model_path) -> torch.Tensor:
    from easyrl.config import FSDPConfig, ModelConfig
    from easyrl.workers.fsdp_utils import build_device_mesh, build_fsdp_model

    module = build_fsdp_model(
        ModelConfig(model_path=str(model_path), enable_gradient_checkpointing=False),
        FSDPConfig(torch_dtype="fp32", mp_param_dtype="fp32"),
        build_device_mesh(1, -1),
        kind="value",
        trainable=True,
        default_dtype=torch.float32,
    )
    (name, weight), *_ = [(n, p) for n, p in module.named_parameters() if n.startswith("score.")]
    return weight.full_tensor().detach().clone()


def test_a_critic_built_twice_from_a_causal_lm_gets_the_same_value_head(tiny_model_path, one_rank_gloo_group):
    """transformers drew the head from the process's generator, which nothing seeds: two PPO runs of one config
    differed from step 1 (values, vf_loss, then samples), and a resumed run could not be checked against one run."""
    heads = []
    for seed in (1, 2):  # whatever state the process's generator is in
        torch.manual_seed(seed)
        heads.append(_value_head(tiny_model_path))
        expected = torch.Generator().manual_seed(seed)
        assert torch.equal(torch.rand(3), torch.rand(3, generator=expected))  # that generator is left as it was
    assert heads[0].shape[0] == 1 and heads[0].abs().sum() > 0  # a drawn head, not zeros
    assert torch.equal(heads[0], heads[1])
