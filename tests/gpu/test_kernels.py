"""The fused LM head (no (tokens x vocab) logits) and Liger's kernels on CUDA: same log-probs, less memory.

Liger patches transformers' classes for the whole process, so its test runs last in this file and loads its
reference model before patching.
"""

import torch

from easyrl.testing.single_rank import build_actor
from easyrl.utils.torch_functional import compiled_kernel_calls, torch_compile_unavailable_reason
from tests.gpu.test_compute_path import BF16, log_probs, rollout


def peak_update_bytes(actor, data) -> tuple[int, torch.Tensor]:
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    start = torch.cuda.memory_allocated()
    actor.update_policy(data)
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - start


def test_fused_head_gives_the_same_log_probs_without_the_logits_tensor(process_group, small_qwen2_path):
    # one micro-batch of 16 x 1024 response tokens: its bf16 logits are 16k x 32k x 2 B = 1 GiB, their fp32 gradient
    # chunks aside
    settings = [*BF16, "worker.actor.micro_batch_size_per_device_for_update=16", "worker.actor.optim.lr=1e-4"]
    data = rollout(batch_size=16, prompt_length=64, response_length=1024, seed=5)
    mask = data.batch["response_mask"].bool()
    response_tokens = int(mask.sum())
    results = {}
    for fused in (False, True):
        actor, _, _ = build_actor(
            small_qwen2_path, [*settings, f"worker.actor.model.use_fused_kernels={fused}"], batch_size=16
        )
        lp = log_probs(actor, data)
        actor.update_policy(data)  # optimizer states exist before measuring
        results[fused] = (lp, peak_update_bytes(actor, data))
        del actor
        torch.cuda.empty_cache()
    diff = (results[True][0] - results[False][0])[mask].abs()
    assert diff.mean() < 0.01 and diff.max() < 0.2, (diff.mean().item(), diff.max().item())
    logits_bytes = response_tokens * 32000 * 2
    saved = results[False][1] - results[True][1]
    print(f"peak update memory: unfused {results[False][1] / 2**30:.2f} GiB, fused {results[True][1] / 2**30:.2f} GiB")
    assert saved > 0.8 * logits_bytes, (saved, logits_bytes)


def _seconds(fn, repeats: int = 10) -> float:
    fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeats):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / repeats / 1000


def test_triton_log_prob_kernels_equal_float64_on_a_vocabulary_sized_chunk():
    """The compiled chunk kernels' log-prob forward and gradient run utils/triton_logprobs.py on CUDA: the float64
    values on a 151936-column bf16 chunk; prints their memory bandwidth beside torch.compile's kernels of the same
    arithmetic (what they replace)."""
    from easyrl.utils import torch_functional

    vocab = 151936
    rows = torch_functional.rows_per_chunk(vocab)
    logits = torch.randn(rows, vocab, device="cuda", dtype=torch.bfloat16) * 3
    labels = torch.randint(0, vocab, (rows,), device="cuda")
    grad_output = torch.randn(rows, device="cuda")
    kernels = torch_functional.select_chunk_kernels(True)
    calls = compiled_kernel_calls()
    log_probs, logsumexp = kernels.log_probs(logits, labels, 1 / 0.7)
    grad = kernels.log_probs_grad(logits, labels, logsumexp, grad_output, 1 / 0.7)
    assert compiled_kernel_calls() - calls == 2 and torch_functional._TritonOnCuda.failure is None
    z = logits[:16].double() / 0.7
    expected_lse = torch.logsumexp(z, dim=-1)
    torch.testing.assert_close(logsumexp[:16].double(), expected_lse, rtol=1e-6, atol=1e-4)
    expected = z.gather(1, labels[:16, None]).squeeze(1) - expected_lse
    torch.testing.assert_close(log_probs[:16].double(), expected, rtol=1e-6, atol=1e-4)
    probs = torch.softmax(z, dim=-1)
    expected_grad = (torch.nn.functional.one_hot(labels[:16], vocab).double() - probs) * grad_output[:16, None] / 0.7
    torch.testing.assert_close(grad[:16].double(), expected_grad, rtol=1e-2, atol=1e-3)

    inductor_forward = torch.compile(torch_functional._log_probs_chunk, dynamic=True, fullgraph=True)
    inductor_grad = torch.compile(torch_functional._log_probs_grad_chunk, dynamic=True, fullgraph=True)
    bytes_read = logits.numel() * logits.element_size()
    for name, fn, moved in (
        ("forward, Triton", lambda: kernels.log_probs(logits, labels, 1 / 0.7), bytes_read),
        ("forward, torch.compile", lambda: inductor_forward(logits, labels, 1 / 0.7), bytes_read),
        ("gradient, Triton", lambda: kernels.log_probs_grad(logits, labels, logsumexp, grad_output, 1 / 0.7), 2 * bytes_read),
        ("gradient, torch.compile", lambda: inductor_grad(logits, labels, logsumexp, grad_output, 1 / 0.7), 2 * bytes_read),
    ):  # fmt: skip
        seconds = _seconds(fn)
        print(
            f"{rows} x {vocab} bf16 chunk, log-prob {name}: {1e6 * seconds:.0f} us, {moved / seconds / 1e12:.2f} TB/s"
        )


def test_liger_kernels_replace_the_layers_and_keep_log_probs(process_group, small_qwen2_path):
    data = rollout(seed=7)
    plain, _, _ = build_actor(small_qwen2_path, BF16, batch_size=16, trainable=False)
    expected = log_probs(plain, data)
    del plain
    actor, module, _ = build_actor(small_qwen2_path, [*BF16, "worker.actor.model.use_liger=true"], batch_size=16)
    kinds = {type(m).__name__ for m in module.modules()}
    assert any(name.startswith("Liger") for name in kinds), kinds
    # RMSNorm is the model's own layer, compiled (fsdp_utils.LIGER_RMS_NORM): every norm runs compiled code
    norms = [m for m in module.modules() if type(m).__name__.endswith("RMSNorm")]
    assert norms and all(type(m).__name__ == "Qwen2RMSNorm" for m in norms), kinds
    calls = compiled_kernel_calls()
    got = log_probs(actor, data)
    assert compiled_kernel_calls() - calls >= len(norms)
    assert torch_compile_unavailable_reason() is None
    mask = data.batch["response_mask"].bool()
    diff = (got - expected)[mask].abs()
    assert diff.mean() < 0.03 and diff.max() < 0.3, (diff.mean().item(), diff.max().item())
    metrics = actor.update_policy(data)
    assert all(torch.isfinite(torch.tensor(v)) for v in metrics.values() if isinstance(v, float))
