"""`worker.actor.use_torch_compile`: the log-prob and entropy kernels run compiled, give the eager numbers, do not
recompile for a new token count, and fall back to eager with one warning where compiling is impossible."""

import os
import subprocess
import sys

import pytest
import torch
from torch._dynamo.utils import counters

from easyrl.utils.torch_functional import (
    compiled_kernel_calls,
    entropy_from_logits,
    log_probs_from_logits,
    select_logprob_kernels,
    torch_compile_unavailable_reason,
)


pytestmark = pytest.mark.timeout(600)

TEMPERATURE = 0.7


def random_batch(rows: int, vocab: int = 160, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    logits = torch.randn(rows, vocab, generator=generator) * 2
    labels = torch.randint(0, vocab, (rows,), generator=generator)
    return logits, labels


def test_flag_false_gives_the_eager_kernels():
    log_probs_fn, entropy_fn = select_logprob_kernels(False)
    logits, labels = random_batch(9)
    before = compiled_kernel_calls()
    torch.testing.assert_close(log_probs_fn(logits, labels, TEMPERATURE), log_probs_from_logits(logits, labels, 0.7))
    torch.testing.assert_close(entropy_fn(logits, TEMPERATURE), entropy_from_logits(logits, TEMPERATURE))
    assert compiled_kernel_calls() == before


def test_compiled_kernels_equal_eager_values_and_gradients_and_run_compiled():
    log_probs_fn, entropy_fn = select_logprob_kernels(True)
    logits, labels = random_batch(48)
    calls = compiled_kernel_calls()

    eager_logits = logits.clone().requires_grad_(True)
    compiled_logits = logits.clone().requires_grad_(True)
    eager = log_probs_from_logits(eager_logits, labels, TEMPERATURE)
    compiled = log_probs_fn(compiled_logits, labels, TEMPERATURE)
    weights = torch.linspace(-1, 1, 48)
    (eager * weights).sum().backward()
    (compiled * weights).sum().backward()
    # fp32 log-probs of magnitude ~5: the same math in another reduction order differs by a few ulps
    torch.testing.assert_close(compiled, eager, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(compiled_logits.grad, eager_logits.grad, rtol=1e-6, atol=1e-6)

    eager_logits.grad = compiled_logits.grad = None
    eager_entropy = entropy_from_logits(eager_logits, TEMPERATURE)
    compiled_entropy = entropy_fn(compiled_logits, TEMPERATURE)
    (eager_entropy * weights).sum().backward()
    (compiled_entropy * weights).sum().backward()
    # H = logsumexp(z) - E[z] cancels: eager fp32 is itself 1.9e-6 from a float64 reference here (compiled 1.5e-6)
    torch.testing.assert_close(compiled_entropy, eager_entropy, rtol=0, atol=4e-6)
    torch.testing.assert_close(compiled_logits.grad, eager_logits.grad, rtol=0, atol=4e-6)

    assert torch_compile_unavailable_reason() is None
    # the forward, backward and entropy chunk kernels each served a call as compiled code
    assert compiled_kernel_calls() - calls >= 3
    assert counters["aot_autograd"]["ok"] >= 3  # the three chunk kernels became compiled graphs in this process


def test_a_new_token_count_does_not_recompile():
    log_probs_fn, entropy_fn = select_logprob_kernels(True)
    with torch.no_grad():
        for rows in (20, 33):  # the first shapes of this test may still compile (once, with dynamic sizes)
            log_probs_fn(*random_batch(rows), TEMPERATURE)
            entropy_fn(random_batch(rows)[0], TEMPERATURE)
        graphs = counters["stats"]["unique_graphs"]
        for rows in (41, 57, 100):
            logits, labels = random_batch(rows, seed=rows)
            torch.testing.assert_close(
                log_probs_fn(logits, labels, TEMPERATURE),
                log_probs_from_logits(logits, labels, TEMPERATURE),
                rtol=1e-6,
                atol=1e-6,
            )
            entropy_fn(logits, TEMPERATURE)
    assert counters["stats"]["unique_graphs"] == graphs


def test_the_compiled_log_prob_gradient_is_one_pass_over_the_chunk():
    """The gradient of a chunk's log-probs compiles to one element-wise kernel (read the logits, write the gradient),
    not a scatter into an fp32 copy re-read by a second kernel: the fused LM head's backward is bound by these bytes."""
    from torch._inductor import metrics

    from easyrl.utils.torch_functional import _log_probs_grad_chunk

    generator = torch.Generator().manual_seed(3)
    logits = torch.randn(12, 300, generator=generator).to(torch.bfloat16)
    labels = torch.randint(0, 300, (12,), generator=generator)
    logsumexp = torch.logsumexp(logits.float() / TEMPERATURE, dim=-1)
    grad_output = torch.randn(12, generator=generator)
    metrics.reset()
    compiled = torch.compile(_log_probs_grad_chunk, dynamic=True, fullgraph=True)
    got = compiled(logits, labels, logsumexp, grad_output, 1 / TEMPERATURE)
    assert metrics.generated_kernel_count == 1
    assert got.dtype == torch.bfloat16
    # (onehot - softmax(z / T)) / T x incoming gradient, in float64
    probs = torch.softmax(logits.double() / TEMPERATURE, dim=-1)
    expected = (
        (torch.nn.functional.one_hot(labels, 300).double() - probs) * grad_output.double()[:, None] / TEMPERATURE
    )
    torch.testing.assert_close(got.double(), expected, rtol=1e-2, atol=1e-3)


TRITON_PROGRAM = """
import torch
from easyrl.utils import triton_logprobs

torch.manual_seed(0)
T = 0.7
for dtype, rows, vocab, block in ((torch.float32, 5, 1000, 64), (torch.bfloat16, 3, 333, 32), (torch.float32, 2, 64, 64)):
    # a wider buffer: rows are not contiguous with each other, as a slice of a larger chunk
    wide = torch.randn(rows, vocab + 24) * 4
    wide[0, 7] = 60.0  # one dominant logit: the merge of the splits must keep it
    logits = wide[:, :vocab].to(dtype)
    labels = torch.randint(0, vocab, (rows,))
    labels[0], labels[-1] = 0, vocab - 1
    log_probs, lse = triton_logprobs.log_probs_chunk(logits, labels, 1 / T, block=block)
    z = logits.double() / T
    ref_lse = torch.logsumexp(z, dim=-1)
    torch.testing.assert_close(lse.double(), ref_lse, rtol=1e-6, atol=1e-5)
    torch.testing.assert_close(log_probs.double(), z.gather(1, labels[:, None]).squeeze(1) - ref_lse, rtol=1e-6, atol=1e-5)
    grad_output = torch.randn(rows)
    grad = triton_logprobs.log_probs_grad_chunk(logits, labels, lse, grad_output, 1 / T, block=block)
    assert grad.dtype == dtype and grad.shape == logits.shape
    expected = (torch.nn.functional.one_hot(labels, vocab).double() - torch.softmax(z, -1)) * grad_output.double()[:, None] / T
    tolerance = 1e-5 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(grad.double(), expected, rtol=tolerance, atol=tolerance)
print("triton kernels ok")
"""


def test_triton_log_prob_kernels_equal_a_float64_reference_in_the_interpreter():
    """The GPU's log-prob kernels (utils/triton_logprobs.py), run by Triton's interpreter on the CPU: a row split over
    several log-sum-exp programs, a last block and split cut short, rows that are slices of a wider buffer, labels at
    the first and last column, fp32 and bf16."""
    pytest.importorskip("triton")
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    result = subprocess.run(
        [sys.executable, "-c", TRITON_PROGRAM], capture_output=True, text=True, timeout=300, env=env
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "triton kernels ok" in result.stdout


def test_rms_norms_run_compiled_with_one_graph_for_all_layers_and_eager_numbers():
    """`use_liger` runs the model's own RMSNorm layers compiled (fsdp_utils.compile_rms_norms): every layer, one
    compiled graph for all of them and for any token count, the eager values and gradients."""
    from transformers import AutoModelForCausalLM, Qwen2Config

    from easyrl.workers.fsdp_utils import compile_rms_norms

    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=2,
    )  # fmt: skip
    model = AutoModelForCausalLM.from_config(config)
    norms = [m for m in model.modules() if type(m).__name__.endswith("RMSNorm")]
    for norm in norms:  # not all ones, so that a gradient through the weight shows
        norm.weight.data.uniform_(0.5, 1.5)
    ids = torch.randint(0, 256, (2, 17))
    expected = model(ids).logits
    expected.square().mean().backward()
    expected_grads = {name: p.grad.clone() for name, p in model.named_parameters()}
    model.zero_grad()

    assert compile_rms_norms(model) == len(norms) == 2 * 3 + 1
    calls, graphs = compiled_kernel_calls(), counters["stats"]["unique_graphs"]
    got = model(ids).logits
    got.square().mean().backward()
    model(torch.randint(0, 256, (3, 29)))  # another token count: no new graph
    assert compiled_kernel_calls() - calls == 2 * len(norms)
    assert counters["stats"]["unique_graphs"] - graphs == 1
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    for name, param in model.named_parameters():
        torch.testing.assert_close(param.grad, expected_grads[name], rtol=1e-4, atol=1e-6, msg=name)


FALLBACK_PROGRAM = """
import logging, torch
logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s")
{setup}
from easyrl.utils.torch_functional import (compiled_kernel_calls, log_probs_from_logits, select_logprob_kernels,
                                           torch_compile_unavailable_reason)
log_probs_fn, entropy_fn = select_logprob_kernels(True)
logits, labels = torch.randn(12, 96), torch.randint(0, 96, (12,))
for _ in range(3):
    assert torch.equal(log_probs_fn(logits, labels, 0.7), log_probs_from_logits(logits, labels, 0.7))
    entropy_fn(logits, 0.7)
print("compiled calls", compiled_kernel_calls(), "|", torch_compile_unavailable_reason())
"""


def run_fallback_program(setup: str, env_extra: dict | None = None) -> subprocess.CompletedProcess:
    import os

    env = {**os.environ, **(env_extra or {})}
    code = FALLBACK_PROGRAM.format(setup=setup)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)


def test_without_a_working_compiler_the_kernels_run_eagerly_after_one_warning():
    # a C++ compiler that does not exist: inductor cannot build the CPU kernels (a real compile failure, no mock)
    result = run_fallback_program('import torch._inductor.config as c; c.cpp.cxx = ("/nonexistent/c++",)')
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.startswith("compiled calls 0 | torch.compile failed")
    warnings = [line for line in result.stderr.splitlines() if line.startswith("WARNING")]
    assert len(warnings) == 1 and "worker.actor.use_torch_compile" in warnings[0], result.stderr[-3000:]


def test_torchdynamo_disable_is_reported_not_silent():
    result = run_fallback_program("", {"TORCHDYNAMO_DISABLE": "1"})
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip() == (
        "compiled calls 0 | torch.compile is disabled in this process (TORCHDYNAMO_DISABLE=1)"
    )
    warnings = [line for line in result.stderr.splitlines() if line.startswith("WARNING")]
    assert len(warnings) == 1, result.stderr[-3000:]
