"""The ``easyrl_varlen`` attention implementation computes what sdpa computes, for every kind of call a model makes.

On GPUs it runs PyTorch's varlen flash kernel on packed rows (tests/gpu checks that path); here, on CPU in fp32, the
same function takes its exact fallbacks (one sdpa call per packed sequence, a dense padding mask otherwise), so the
routing (which call is packed, where the boundaries come from, causality, decoding with a cache) is checked on CPU.
"""

import pytest
import torch

from easyrl.models import attention
from easyrl.models.padding_free import pack_batch
from tests.fsdp_helpers import make_batch


@pytest.fixture(scope="module")
def models(tiny_model_path):
    from transformers import AutoModelForCausalLM

    def load(implementation):
        return AutoModelForCausalLM.from_pretrained(
            tiny_model_path, dtype=torch.float32, attn_implementation=implementation
        ).eval()

    return load("sdpa"), load(attention.register())


def test_boundaries_come_from_position_ids_restarting_at_zero():
    cu_seqlens, longest = attention._boundaries_from_position_ids(torch.tensor([[0, 1, 2, 0, 1, 0, 1, 2, 3]]))
    assert cu_seqlens.tolist() == [0, 3, 5, 9] and cu_seqlens.dtype == torch.int32
    assert longest == 4


def test_a_packed_row_without_the_varlen_kernel_runs_one_unmasked_sdpa_call_per_sequence(monkeypatch):
    """No (tokens x tokens) mask: each sequence attends within itself, and the result is the block-diagonal one."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 4, 9, 8) for _ in range(3))
    cu_seqlens = torch.tensor([0, 3, 5, 9], dtype=torch.int32)
    calls = []
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def spy(query, key, value, attn_mask=None, **kwargs):
        calls.append((query.shape[2], key.shape[2], attn_mask))
        return sdpa(query, key, value, attn_mask=attn_mask, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
    module = torch.nn.Module()
    module.is_causal = True
    out, _ = attention.varlen_attention_forward(
        module, q, k, v, None, **attention.packed_attention_kwargs(cu_seqlens, 4)
    )
    assert [(queries, keys) for queries, keys, _ in calls] == [(3, 3), (2, 2), (4, 4)]
    assert all(mask is None for _, _, mask in calls)
    segment = torch.repeat_interleave(torch.arange(3), torch.tensor([3, 2, 4]))
    block_diagonal = (segment[:, None] == segment[None, :]) & torch.ones(9, 9, dtype=torch.bool).tril()
    expected = sdpa(q, k, v, attn_mask=block_diagonal).transpose(1, 2)
    torch.testing.assert_close(out, expected)


@pytest.mark.parametrize("explicit_boundaries", [True, False])
def test_packed_row_equals_the_padded_batch_under_sdpa(models, explicit_boundaries):
    reference, varlen = models
    batch = make_batch(batch_size=4).batch
    with torch.no_grad():
        padded = reference(
            input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], position_ids=batch["position_ids"]
        ).logits
        packed = pack_batch(batch["input_ids"], batch["attention_mask"], batch["position_ids"])
        extra = attention.packed_attention_kwargs(packed.cu_seqlens, packed.max_seqlen) if explicit_boundaries else {}
        logits = varlen(input_ids=packed.input_ids, position_ids=packed.position_ids, **extra).logits[0]
    expected = padded.reshape(-1, padded.shape[-1])[packed.indices]
    torch.testing.assert_close(logits, expected, rtol=1e-5, atol=1e-5)
    # and the sequences really are kept apart: one long causal row over the same tokens differs
    with torch.no_grad():
        crossing = varlen(input_ids=packed.input_ids).logits[0]
    assert (crossing - expected).abs().max() > 1e-2


def test_padded_batch_equals_sdpa_with_left_padding(models):
    reference, varlen = models
    batch = make_batch(batch_size=3).batch
    kwargs = {k: batch[k] for k in ("input_ids", "attention_mask", "position_ids")}
    with torch.no_grad():
        expected, got = reference(**kwargs).logits, varlen(**kwargs).logits
    real = batch["attention_mask"].bool()
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got[real], expected[real], rtol=1e-5, atol=1e-5)


def test_generation_with_a_cache_matches_sdpa(models):
    reference, varlen = models
    input_ids = torch.tensor([[0, 0, 5, 6, 7], [8, 9, 10, 11, 12]])
    attention_mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])
    settings = {"max_new_tokens": 6, "do_sample": False, "pad_token_id": 0}
    with torch.no_grad():
        expected = reference.generate(input_ids=input_ids, attention_mask=attention_mask, **settings)
        got = varlen.generate(input_ids=input_ids, attention_mask=attention_mask, **settings)
    assert torch.equal(got, expected)


def test_non_causal_calls_see_the_whole_sequence():
    """A vision tower's attention (is_causal False) must not be made causal by the fallback."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 6, 8) for _ in range(3))
    module = torch.nn.Module()
    module.is_causal = False
    out, _ = attention.varlen_attention_forward(module, q, k, v, None, is_causal=False)
    expected = torch.nn.functional.scaled_dot_product_attention(q, k, v).transpose(1, 2)
    torch.testing.assert_close(out, expected)


# ----------------------------------------------------------------------------------------------------------------------
# the attention chosen and Liger's kernels (GPU options), as seen from a CPU-only machine
# ----------------------------------------------------------------------------------------------------------------------
def test_cpu_workers_use_easyrl_varlen():
    """Without flash-attn the workers' models run easyrl's attention: a packed row never gets transformers' mask."""
    from easyrl.workers.fsdp_utils import attention_implementation

    assert attention_implementation() == attention.NAME


def test_check_refuses_liger_without_liger_kernel(valid_args):
    import importlib.util

    from easyrl.config import ConfigError, load_config

    if importlib.util.find_spec("liger_kernel") is not None:
        pytest.skip("liger-kernel is installed here")
    with pytest.raises(
        ConfigError, match=r"`worker\.actor\.model\.use_liger` is true but liger-kernel is not installed"
    ):
        load_config([*valid_args, "worker.actor.model.use_liger=true"])


def test_liger_on_a_cpu_worker_is_an_error_naming_the_key(tiny_model_path):
    from transformers import AutoConfig

    from easyrl.workers.fsdp_utils import apply_liger_kernels

    with pytest.raises(RuntimeError, match=r"`worker\.actor\.model\.use_liger` is true but this worker has no GPU"):
        apply_liger_kernels(AutoConfig.from_pretrained(tiny_model_path), "worker.actor.model.use_liger")
