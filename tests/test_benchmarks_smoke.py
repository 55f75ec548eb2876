"""The benchmarks' cheap parts: the result record, the padding trim of the bare baseline, the GPU script's CPU exit."""

import json

import pytest
import torch

import easyrl  # noqa: F401  (process environment)
from benchmarks.bare import trim_padding
from benchmarks.common import append_result
from easyrl.utils import device


def test_append_result_writes_one_line_with_machine_versions_and_commit(tmp_path):
    path = tmp_path / "results.jsonl"
    append_result("demo", {"ratio": 1.5}, path=path)
    append_result("demo", {"ratio": 2.5}, path=path)
    lines = path.read_text().splitlines()
    record = json.loads(lines[-1])
    assert len(lines) == 2
    assert record["benchmark"] == "demo" and record["results"] == {"ratio": 2.5}
    assert record["machine"]["cores"] >= 1 and record["versions"]["torch"].startswith("2.")
    assert len(record["git"]["commit"]) == 40


def test_trim_padding_keeps_only_columns_some_row_uses():
    # prompt width 4 (left-padded: longest prompt 2), response width 3 (longest response 2)
    attention_mask = torch.tensor([[0, 0, 1, 1, 1, 1, 0], [0, 0, 0, 1, 1, 0, 0]])
    response_mask = attention_mask[:, 4:]
    batch = {
        "input_ids": torch.arange(14).reshape(2, 7),
        "attention_mask": attention_mask,
        "responses": torch.tensor([[7, 8, 0], [9, 0, 0]]),
        "response_mask": response_mask,
    }
    trimmed = trim_padding(batch, prompt_width=4)
    assert trimmed["input_ids"].tolist() == [[2, 3, 4, 5], [9, 10, 11, 12]]
    assert trimmed["attention_mask"].tolist() == [[1, 1, 1, 1], [0, 1, 1, 0]]
    assert trimmed["responses"].tolist() == [[7, 8], [9, 0]]


@pytest.mark.skipif(device.is_cuda_available(), reason="the script runs for real on a GPU")
def test_actor_update_gpu_parses_its_arguments_and_stops_without_a_gpu():
    from benchmarks import actor_update_gpu

    assert actor_update_gpu.parse_args(["--batch", "8"]).batch == 8
    with pytest.raises(SystemExit, match="needs an NVIDIA GPU"):
        actor_update_gpu.main(["--batch", "8"])


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_lora_sync_benchmark_moves_the_adapter_not_the_model(ray_cluster, tiny_model_path):
    from benchmarks.lora_sync import measure, summarise

    full = summarise("full", measure(str(tiny_model_path), "full", steps=1, rank=8))
    lora = summarise("lora", measure(str(tiny_model_path), "lora", steps=1, rank=8))
    # rank-8 adapters of the tiny model, fp32 (hand count in tests/test_lora_rollout.py); the full model is 12.9 MB
    assert (lora["route"], lora["sync_bytes"]) == ("adapter", 2 * 8192 * 4)
    assert full["sync_bytes"] > 100 * lora["sync_bytes"]
    assert lora["peak_rss_GiB"] > 0 and lora["update_s"] > 0


@pytest.mark.timeout(300)
def test_ulysses_memory_benchmark_measures_one_sequence_and_shared_prompts():
    from benchmarks import ulysses_memory

    small = ["--tokens", "256", "--layers", "1", "--hidden", "64", "--heads", "4", "--kv-heads", "2", "--no-record"]
    # one run of the two process groups (each costs its processes' start): unshared and shared rows of 3 samples
    shared = ulysses_memory.main([*small, "--samples", "3"])
    assert shared["samples"] == 3
    assert 0 < shared["saved_for_backward_mib_ulysses_2_per_rank"] < shared["saved_for_backward_mib_ulysses_1"]
    # the shared row holds the 128-token prompt once for the 3 samples: less kept than the unshared row
    assert 0 < shared["ratio_shared_over_unshared_ulysses_2"] < 1


def test_actor_update_gpu_groups_kernels_by_kind():
    from benchmarks.actor_update_gpu import kernel_kind

    names = {
        "nvjet_sm90_tst_128x248_64x4_1x2_h_bz_coopA_NNT": "matrix products",
        "void pytorch_flash::flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel<Flash_bwd_kernel_traits<64>>": "attention",
        "_swiglu_backward_kernel": "liger",
        "_triton_rope": "liger",
        "triton_red_fused__to_copy_mean_mul_pow_rsqrt_0": "torch.compile (RMSNorm, entropy)",
        "_partial_logsumexp_kernel": "log-prob kernels (Triton)",
        "_log_probs_grad_kernel": "log-prob kernels (Triton)",
        "_merge_kernel": "log-prob kernels (Triton)",
        "void at::native::(anonymous namespace)::multi_tensor_apply_kernel<FusedAdamMathFunctor>": "optimizer",
        "void at::native::vectorized_elementwise_kernel<8, at::native::CUDAFunctor_add<c10::BFloat16>>": "element-wise",
        "ncclDevKernel_AllGather_RING_LL": "other",
    }
    assert {name: kernel_kind(name) for name in names} == names
