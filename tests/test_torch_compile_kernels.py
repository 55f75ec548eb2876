"""`worker.actor.use_torch_compile`: the log-prob and entropy kernels run compiled, give the eager numbers, do not
recompile for a new token count, and fall back to eager with one warning where compiling is impossible."""

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
