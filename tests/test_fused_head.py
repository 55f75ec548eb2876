"""`worker.actor.model.use_fused_kernels`: log-probs, entropies and gradients computed in the LM head from hidden states
equal the logits path (fp32), and no (tokens, vocab) tensor is kept for the backward pass."""

import math

import pytest
import torch

import easyrl.utils.torch_functional as torch_functional
from easyrl.config import ActorConfig, ConfigError, FSDPConfig, ModelConfig, RefConfig, load_config
from easyrl.models.fused_head import FusedHeadRequest, fused_log_probs_and_entropy
from easyrl.utils.torch_functional import select_chunk_kernels
from easyrl.workers.actor import Actor
from tests.fsdp_helpers import add_policy_targets, make_batch


EAGER = select_chunk_kernels(False)
# fp32, the same arithmetic in another order: measured at most 1e-6 apart for log-probs of magnitude ~10 and 2e-6 in
# relative gradient norm; a wrong label, temperature or gradient term moves them by orders of magnitude more
VALUE_TOLERANCE = {"atol": 1e-5, "rtol": 1e-5}
GRAD_RELATIVE_TOLERANCE = 1e-5


@pytest.fixture(autouse=True)
def few_rows_per_chunk(monkeypatch):
    """Six rows of a 49152-token vocabulary per chunk: every batch here spans several chunks and a ragged last one."""
    monkeypatch.setattr(torch_functional, "_CHUNK_ELEMENTS", 300_000)


def _load(path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="sdpa")


@pytest.fixture(scope="module")
def tied_lm(tiny_model_path):
    return _load(tiny_model_path)


@pytest.fixture(scope="module")
def untied_lm(tiny_untied_model_path):
    return _load(tiny_untied_model_path)


def _actor(model, fused: bool, padding_free: bool, **overrides) -> Actor:
    settings = {
        "padding_free": padding_free,
        "dynamic_batching": False,
        "micro_batch_size_per_device_for_experience": 4,
        "use_torch_compile": False,
        "loss_type": "ppo",
        "loss_avg_mode": "token-mean",
    }
    config = ActorConfig(**{**settings, **overrides})
    config.model.use_fused_kernels = fused
    return Actor(config, model)


def _gradients(model) -> dict[str, torch.Tensor]:
    grads = {name: param.grad.clone() for name, param in model.named_parameters() if param.grad is not None}
    model.zero_grad(set_to_none=True)
    return grads


def _assert_same_gradients(ours: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> None:
    assert set(ours) == set(expected)
    for name, grad in expected.items():
        # (a picture tower that saw only the blank picture gets zeros on both paths)
        error, size = (ours[name] - grad).norm(), grad.norm()
        assert error <= GRAD_RELATIVE_TOLERANCE * size, f"{name}: gradient error {error:.2e} at norm {size:.2e}"


MODELS = pytest.mark.parametrize("model_name", ["tied_lm", "untied_lm"], ids=["tied", "untied"])
PACKING = pytest.mark.parametrize("padding_free", [False, True], ids=["padded", "padding_free"])


# ----------------------------------------------------------------------------------------------------------------------
# the fused function on its own
# ----------------------------------------------------------------------------------------------------------------------
def test_fused_head_gives_hand_worked_log_prob_and_entropy():
    # logits (1, 0): p = (e, 1) / (e + 1); log p(0) = -log(1 + e^-1); H = log(1 + e) - e / (1 + e)
    hidden, weight = torch.tensor([[1.0, 0.0]]), torch.eye(2)
    out = fused_log_probs_and_entropy(hidden, weight, None, torch.tensor([0]), FusedHeadRequest(1.0, EAGER, True))
    assert out.shape == (1, 2)
    torch.testing.assert_close(out[0], torch.tensor([-0.3132617, 0.5822031]))


def test_fused_head_with_bias_matches_full_log_softmax_values_and_gradients(monkeypatch):
    monkeypatch.setattr(torch_functional, "_CHUNK_ELEMENTS", 4 * 50)  # 4 rows per chunk: 13 rows in 4 chunks
    gen = torch.Generator().manual_seed(0)
    hidden = torch.randn(13, 16, generator=gen, requires_grad=True)
    head = torch.nn.Linear(16, 50, bias=True)
    labels = torch.randint(0, 50, (13,), generator=gen)
    w_log_prob, w_entropy = torch.randn(13, generator=gen), torch.randn(13, generator=gen)

    out = fused_log_probs_and_entropy(hidden, head.weight, head.bias, labels, FusedHeadRequest(0.6, EAGER, True))
    (out[:, 0] * w_log_prob + out[:, 1] * w_entropy).sum().backward()
    ours = [out.detach(), hidden.grad, head.weight.grad, head.bias.grad]
    hidden.grad = head.weight.grad = head.bias.grad = None

    log_softmax = torch.log_softmax(head(hidden) / 0.6, dim=-1)
    log_prob = log_softmax.gather(-1, labels[:, None]).squeeze(-1)
    entropy = -(log_softmax.exp() * log_softmax).sum(-1)
    (log_prob * w_log_prob + entropy * w_entropy).sum().backward()
    expected = [torch.stack([log_prob, entropy], -1).detach(), hidden.grad, head.weight.grad, head.bias.grad]
    for got, want in zip(ours, expected):
        torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)


# ----------------------------------------------------------------------------------------------------------------------
# the actor with and without fused kernels
# ----------------------------------------------------------------------------------------------------------------------
@MODELS
@PACKING
def test_fused_log_probs_and_entropies_equal_the_logits_path(model_name, padding_free, request):
    model = request.getfixturevalue(model_name)
    data = make_batch(batch_size=6, seed=4)  # temperature 0.7
    expected = _actor(model, False, padding_free).compute_log_probs(data, calculate_entropy=True)
    log_probs, entropy = _actor(model, True, padding_free).compute_log_probs(data, calculate_entropy=True)
    torch.testing.assert_close(log_probs, expected[0], **VALUE_TOLERANCE)
    torch.testing.assert_close(entropy, expected[1], **VALUE_TOLERANCE)
    assert (entropy[data.batch["response_mask"].bool()] > 1.0).all()  # real entropies, not the zeros of padding


@MODELS
@PACKING
def test_fused_policy_loss_with_entropy_bonus_gives_the_logits_path_gradients(model_name, padding_free, request):
    model = request.getfixturevalue(model_name)
    data = make_batch(batch_size=6, seed=5)
    data = add_policy_targets(data, _actor(model, False, padding_free).compute_log_probs(data)[0] - 0.05, seed=5)
    denominator = float(data.batch["response_mask"].sum())
    results = []
    for fused in (False, True):
        loss, metrics = _actor(model, fused, padding_free, entropy_coef=0.3)._micro_loss(data, denominator)
        loss.backward()
        results.append((loss.detach(), metrics, _gradients(model)))
    (loss_plain, metrics_plain, grads_plain), (loss_fused, metrics_fused, grads_fused) = results
    torch.testing.assert_close(loss_fused, loss_plain, **VALUE_TOLERANCE)
    assert metrics_fused["entropy"] == pytest.approx(metrics_plain["entropy"], rel=1e-5)
    assert "model.embed_tokens.weight" in grads_fused  # the head (tied: the embedding) gets its gradient
    _assert_same_gradients(grads_fused, grads_plain)


def test_entropy_as_a_metric_only_carries_no_gradient(tied_lm):
    # on-policy with entropy_coef 0: the entropy is reported, the loss is the policy loss alone
    data = make_batch(batch_size=6, seed=6)
    data = add_policy_targets(data, torch.zeros(data.batch["response_mask"].shape), seed=6)
    denominator = float(data.batch["response_mask"].sum())
    results = []
    for fused in (False, True):
        actor = _actor(tied_lm, fused, padding_free=True)
        _, entropy = actor._forward(data, 0.7, calculate_entropy=True, entropy_grad=False)
        assert not entropy.requires_grad
        loss, metrics = actor._micro_loss(data, denominator, on_policy=True)
        loss.backward()
        results.append((metrics["entropy"], _gradients(tied_lm)))
    assert results[1][0] == pytest.approx(results[0][0], rel=1e-5)
    _assert_same_gradients(results[1][1], results[0][1])


def test_reference_reads_its_copy_of_the_actor_setting(tied_lm):
    data = make_batch(batch_size=4, seed=7)
    expected, _ = _actor(tied_lm, False, padding_free=True).compute_log_probs(data)
    ref = Actor(
        RefConfig(padding_free=True, micro_batch_size_per_device_for_experience=4, use_torch_compile=False,
                  use_fused_kernels=True),
        tied_lm,
    )  # fmt: skip
    assert ref.use_fused_kernels
    torch.testing.assert_close(ref.compute_log_probs(data)[0], expected, **VALUE_TOLERANCE)


# ----------------------------------------------------------------------------------------------------------------------
# memory: what the backward pass keeps
# ----------------------------------------------------------------------------------------------------------------------
def _saved_activation_shapes(actor: Actor, model, data) -> list[tuple[int, ...]]:
    """Shapes of the tensors autograd keeps for the backward pass of log-probs + entropy, parameters left out."""
    parameters = {param.untyped_storage().data_ptr() for param in model.parameters()}
    shapes = []

    def pack(tensor):
        if tensor.untyped_storage().data_ptr() not in parameters:
            shapes.append(tuple(tensor.shape))
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        actor._forward(data, 0.7, calculate_entropy=True)
    return shapes


@PACKING
def test_fused_path_keeps_no_tokens_by_vocabulary_tensor_for_backward(tied_lm, padding_free):
    data = make_batch(batch_size=4, seed=8)
    vocab = tied_lm.config.vocab_size
    tokens = int(data.batch["response_mask"].sum())
    plain = _saved_activation_shapes(_actor(tied_lm, False, padding_free), tied_lm, data)
    fused = _saved_activation_shapes(_actor(tied_lm, True, padding_free), tied_lm, data)
    assert (tokens, vocab) in plain  # the logits of every response token
    assert max(math.prod(shape) for shape in plain) >= tokens * vocab
    # the largest kept activation is now a decoder layer's (rows x intermediate): nothing vocabulary-sized
    assert all(vocab not in shape for shape in fused), [shape for shape in fused if vocab in shape]
    assert max(math.prod(shape) for shape in fused) < vocab


# ----------------------------------------------------------------------------------------------------------------------
# a vision-language model: the blank row of a text-only micro-batch has no labels
# ----------------------------------------------------------------------------------------------------------------------
@pytest.mark.timeout(120)
@PACKING
def test_vlm_fused_log_probs_equal_the_logits_path_with_a_blank_row(tiny_vl_model_path, padding_free):
    from transformers import AutoModelForImageTextToText, AutoProcessor

    from easyrl.testing.vl_batch import VLSample, make_vl_batch, random_image

    processor = AutoProcessor.from_pretrained(tiny_vl_model_path)
    model = AutoModelForImageTextToText.from_pretrained(
        tiny_vl_model_path, dtype=torch.float32, attn_implementation="sdpa"
    )
    samples = [VLSample("Count the shapes.", images=[random_image(0)]), VLSample("Hello there, how are you?")]
    data = make_vl_batch(processor, str(tiny_vl_model_path), samples, response_length=6, seed=1)
    data.meta_info["temperature"] = 0.8
    outputs = []
    for fused in (False, True):
        config = ActorConfig(padding_free=padding_free, dynamic_batching=False, use_torch_compile=False)
        config.micro_batch_size_per_device_for_experience = 1  # the text-only row alone: a blank picture row
        config.model.use_fused_kernels = fused
        actor = Actor(config, model, processor=processor)
        values = actor.compute_log_probs(data, calculate_entropy=True)
        log_probs, _ = actor._forward(data[1:2], 0.8, calculate_entropy=False)
        log_probs.sum().backward()
        outputs.append((values, _gradients(model)))
    (plain, grads_plain), (fused, grads_fused) = outputs
    torch.testing.assert_close(fused[0], plain[0], **VALUE_TOLERANCE)
    torch.testing.assert_close(fused[1], plain[1], **VALUE_TOLERANCE)
    _assert_same_gradients(grads_fused, grads_plain)


# ----------------------------------------------------------------------------------------------------------------------
# FSDP2: the head's weight exists whole only inside the root module's forward
# ----------------------------------------------------------------------------------------------------------------------
@pytest.mark.timeout(120)
def test_fsdp2_fused_log_probs_and_gradients_equal_the_logits_path(tiny_model_path, one_rank_gloo_group):
    from torch.distributed.tensor import DTensor

    from easyrl.workers.fsdp_utils import build_device_mesh, build_fsdp_model

    fsdp = FSDPConfig(torch_dtype="fp32", mp_param_dtype="fp32")
    module = build_fsdp_model(
        ModelConfig(model_path=str(tiny_model_path)),
        fsdp,
        build_device_mesh(1, -1),
        kind="causal_lm",
        trainable=True,
        default_dtype=torch.float32,
    )
    assert isinstance(module.get_output_embeddings().weight, DTensor)  # sharded outside the forward
    data = make_batch(batch_size=6, seed=9)
    results = []
    for fused in (False, True):
        log_probs, entropy = _actor(module, fused, padding_free=True)._forward(data, 0.7, calculate_entropy=True)
        (log_probs.sum() + 0.3 * entropy.sum()).backward()
        grads = {name: grad.full_tensor() for name, grad in _gradients(module).items()}
        results.append((log_probs.detach(), entropy.detach(), grads))
    (lp_plain, entropy_plain, grads_plain), (lp_fused, entropy_fused, grads_fused) = results
    torch.testing.assert_close(lp_fused, lp_plain, **VALUE_TOLERANCE)
    torch.testing.assert_close(entropy_fused, entropy_plain, **VALUE_TOLERANCE)
    _assert_same_gradients(grads_fused, grads_plain)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_two_fsdp_workers_fused_actor_and_reference_match_one_process(ray_cluster, tiny_model_path):
    """Two ranks, each holding half of the (tied) head: log-probs of actor and reference, and one SGD step."""
    from easyrl.workers.fsdp_worker import FSDPWorker
    from tests.fsdp_helpers import (
        load_hf_causal_lm,
        padded_policy_loss,
        per_sequence_log_probs,
        worker_config,
        worker_group,
    )

    config = worker_config(tiny_model_path, 2, lr=0.1)
    config.actor.model.use_fused_kernels = config.ref.use_fused_kernels = True  # as derive sets them
    with worker_group(FSDPWorker, config, "actor_ref", name_prefix="fused", processes=2) as group:
        group.init_model()
        data = make_batch(batch_size=6, seed=12)
        hf_model = load_hf_causal_lm(tiny_model_path)
        expected = per_sequence_log_probs(hf_model, data, temperature=0.7)
        actor_log_probs = group.compute_log_probs(data).batch["old_log_probs"]
        torch.testing.assert_close(actor_log_probs, expected, atol=1e-5, rtol=0)
        torch.testing.assert_close(
            group.compute_ref_log_probs(data).batch["ref_log_probs"], expected, atol=1e-5, rtol=0
        )

        data = add_policy_targets(data, actor_log_probs, seed=12)
        group.update_actor(data)
        padded_policy_loss(hf_model, data, worker_config(tiny_model_path, 1).actor).backward()
        state = group.get_full_state_dict()
        with torch.no_grad():
            for name, param in hf_model.named_parameters():
                torch.testing.assert_close(state[name], param - 0.1 * param.grad, atol=1e-6, rtol=0, msg=name)


# ----------------------------------------------------------------------------------------------------------------------
# config
# ----------------------------------------------------------------------------------------------------------------------
def test_reference_gets_the_actor_model_setting(valid_args):
    config = load_config([*valid_args, "worker.actor.model.use_fused_kernels=true"])
    assert config.worker.ref.use_fused_kernels


def test_check_refuses_fused_kernels_for_the_critic(valid_args):
    with pytest.raises(ConfigError, match=r"worker\.critic\.model\.use_fused_kernels"):
        load_config([*valid_args, "worker.critic.model.use_fused_kernels=true"])


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_compiled_kernels_give_the_eager_fused_values_and_gradients(tied_lm):
    data = make_batch(batch_size=6, seed=10)
    calls = torch_functional.compiled_kernel_calls()
    results = []
    for use_torch_compile in (False, True):
        actor = _actor(tied_lm, True, padding_free=True, use_torch_compile=use_torch_compile)
        log_probs, entropy = actor._forward(data, 0.7, calculate_entropy=True)
        (log_probs.sum() + 0.3 * entropy.sum()).backward()
        results.append((log_probs.detach(), entropy.detach(), _gradients(tied_lm)))
    assert torch_functional.compiled_kernel_calls() > calls
    assert torch_functional.torch_compile_unavailable_reason() is None  # no fallback to eager on the way
    (lp_eager, entropy_eager, grads_eager), (lp_compiled, entropy_compiled, grads_compiled) = results
    torch.testing.assert_close(lp_compiled, lp_eager, **VALUE_TOLERANCE)
    torch.testing.assert_close(entropy_compiled, entropy_eager, **VALUE_TOLERANCE)
    _assert_same_gradients(grads_compiled, grads_eager)
