"""FLOPs counts against hand computations and real model parameter counts; device peaks; MFU."""

import pytest
import torch

from easyrl.trainer.flops import FlopsCounter, compute_mfu, cpu_peak_flops, gpu_peak_flops, peak_flops_per_device


def _tiny_qwen2():
    # transformers is imported after easyrl (imported above), whose process set-up it needs on CPU machines
    from transformers import Qwen2Config

    return Qwen2Config(
        hidden_size=64,
        num_attention_heads=2,
        num_key_value_heads=1,
        intermediate_size=128,
        num_hidden_layers=2,
        vocab_size=100,
        tie_word_embeddings=True,
    )


def test_matmul_parameters_of_a_tiny_gqa_config_by_hand():
    # per layer: q 64x64 + k 64x32 + v 64x32 + o 64x64 = 12288; gated MLP 3 x 64 x 128 = 24576
    # 2 layers x 36864 + lm_head 64 x 100 = 80128 (the tied embedding lookup is not a matmul)
    assert FlopsCounter(_tiny_qwen2()).matmul_params == 80128


def test_training_and_forward_flops_of_two_sequences_by_hand():
    counter = FlopsCounter(_tiny_qwen2())
    # 6 N tokens + 12 L (H d_head) sum s^2 = 6 * 80128 * (3 + 5) + 12 * 2 * 64 * (9 + 25)
    assert counter.flops([3, 5]) == 3846144 + 52224
    assert counter.flops([3, 5], backward=False) == (3846144 + 52224) / 3
    # frozen weights (LoRA): 4 N tokens, attention unchanged = 4 * 80128 * 8 + 52224
    assert counter.flops([3, 5], frozen_weights=True) == 2564096 + 52224


def test_shared_prefix_flops_count_each_prompt_once_by_hand():
    counter = FlopsCounter(_tiny_qwen2())
    # one prompt of 3 tokens shared by responses of 2 and 4: 9 tokens; squares 3^2 + (2*3*2 + 2^2) + (2*3*4 + 4^2)
    # = 9 + 16 + 40 = 65 -> 6 * 80128 * 9 + 12 * 2 * 64 * 65
    assert counter.shared_prefix_flops([(3, [2, 4])]) == 6 * 80128 * 9 + 12 * 2 * 64 * 65
    # a prompt with one response costs what the unshared sequence costs
    assert counter.shared_prefix_flops([(3, [5]), (2, [1])]) == counter.flops([8, 3])
    assert counter.shared_prefix_flops([(3, [2, 4])], backward=False, frozen_weights=True) == (
        2 * 80128 * 9 + 4 * 2 * 64 * 65
    )
    # sharing saves exactly the repeated prompt: dense tokens 9 instead of 12, squares 65 instead of 25 + 49
    assert counter.shared_prefix_flops([(3, [2, 4])]) < counter.flops([5, 7])


def test_matmul_parameters_equal_the_linear_weights_of_a_real_model():
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        hidden_size=64,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,  # wider than hidden / heads, as in Qwen3
        intermediate_size=96,
        num_hidden_layers=3,
        vocab_size=300,
        tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(config)
    linear_weights = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
    assert FlopsCounter(config).matmul_params == linear_weights


def test_mixture_of_experts_counts_the_routed_experts_only():
    from transformers import Qwen2Config

    config = Qwen2Config(hidden_size=64, num_attention_heads=2, num_key_value_heads=2, num_hidden_layers=1)
    config.vocab_size = 10
    config.num_experts_per_tok, config.num_experts, config.moe_intermediate_size = 2, 8, 16
    # attention 4 x 64 x 64 = 16384; experts 3 x 64 x (2 x 16) = 6144; router 64 x 8 = 512; lm_head 640
    assert FlopsCounter(config).matmul_params == 16384 + 6144 + 512 + 640


def test_mfu_is_model_flops_over_devices_times_peak():
    assert compute_mfu(flops=1e12, seconds=2.0, n_devices=2, peak_flops_per_device=1e12) == 0.25


@pytest.mark.parametrize(
    ("name", "tflops"),
    [
        ("NVIDIA H100 80GB HBM3", 989.4),
        ("NVIDIA H100 PCIe", 756.0),
        ("NVIDIA H200", 989.4),
        ("NVIDIA A100-SXM4-80GB", 312.0),
        ("NVIDIA L40S", 362.1),
        ("NVIDIA L4", 121.0),
        ("NVIDIA A10G", None),  # not listed, and must not match "A10"
        ("NVIDIA GeForce RTX 4090", None),
    ],
)
def test_gpu_peak_is_looked_up_by_whole_words_of_the_name(name, tflops):
    assert gpu_peak_flops(name) == (tflops * 1e12 if tflops else None)


def test_cpu_peak_scales_with_threads_and_is_at_least_the_fp32_rate():
    one = cpu_peak_flops(torch.float32, threads=1)
    assert one > 1e9  # at least 1 GFLOP/s per core on anything that runs this
    assert cpu_peak_flops(torch.float32, threads=4) == 4 * one
    assert cpu_peak_flops(torch.bfloat16, threads=1) >= one


def test_an_explicit_peak_overrides_the_lookup(monkeypatch):
    monkeypatch.delenv("EASYRL_PEAK_TFLOPS", raising=False)
    assert peak_flops_per_device(override_tflops=100.0) == 100e12
    monkeypatch.setenv("EASYRL_PEAK_TFLOPS", "50")
    assert peak_flops_per_device() == 50e12
