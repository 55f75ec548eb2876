"""Mixture-of-experts weights streamed from the FSDP actor into vLLM, checked on values.

Tiny random Qwen3-MoE (text) and Qwen3-VL-MoE models (easyrl.testing.tiny_moe; expert width != hidden size and
!= half of it, so a transposed stack cannot pass): after each sync, vLLM's log-probs of a fixed token sequence equal
the actor's to fp32 tolerance, also after scaling the up half of a single expert (a swapped gate/up, a wrong expert
order or a missed transpose moves them by far more than the tolerance). Qwen3-MoE's expert width 48 makes vLLM's CPU
kernel pad it (the padded path); the sync runs several times on one engine (each reload re-packs).

Also: the released-layout export (the expert stacks as the released files hold them) reloads in transformers with
the same weights, through `easyrl merge`'s path too, and the layout rules are read from transformers' own mapping.
Each engine runs in a Ray worker so that vLLM's process-wide state stays out of the test process.
"""

import types

import pytest
import torch

import easyrl  # noqa: F401  (process environment before Ray starts)
from easyrl.controller import Dispatch, Worker, register
from tests.fsdp_helpers import worker_group


SEQUENCE_LENGTH = 48
# fp32 engine vs fp32 actor: measured differences are ~1e-5; a layout mistake moves log-probs by 0.1 to 10
TOLERANCE = 1e-3
FAMILIES = ["qwen3_moe", "qwen3_vl_moe"]


def _fixed_sequence(vocab_limit: int = 2000) -> list[int]:
    return torch.randint(100, vocab_limit, (SEQUENCE_LENGTH,), generator=torch.Generator().manual_seed(0)).tolist()


class MoESyncProbe(Worker):
    """An FSDP2-wrapped actor and a vLLM engine started from the same checkpoint, in one process."""

    @register(dispatch_mode=Dispatch.ONE_TO_ALL_RANK_ZERO)
    def setup(self, model_path: str) -> None:
        from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText, AutoTokenizer

        from easyrl.config import FSDPConfig, RolloutConfig
        from easyrl.workers.fsdp_utils import apply_fsdp2, build_device_mesh
        from easyrl.workers.rollout.vllm_rollout import VLLMRollout

        config = AutoConfig.from_pretrained(model_path)
        model_cls = AutoModelForImageTextToText if hasattr(config, "vision_config") else AutoModelForCausalLM
        self.actor = model_cls.from_pretrained(model_path, dtype=torch.float32)
        apply_fsdp2(self.actor, build_device_mesh(1, -1), FSDPConfig(mp_param_dtype="fp32"))
        self.text_config = config.get_text_config()
        tokenizer = AutoTokenizer.from_pretrained(model_path)
        rollout_config = RolloutConfig(
            dtype="fp32",
            tensor_parallel_size=1,
            enforce_eager=True,
            kv_cache_memory_bytes=64 << 20,
            limit_images=0,
            prompt_length=SEQUENCE_LENGTH,
            response_length=8,
            disable_tqdm=True,
        )
        self.rollout = VLLMRollout(model_path, rollout_config, tokenizer, rank=self.rank, world_size=1)
        self.sequence = _fixed_sequence()

    def _local(self, name: str) -> torch.Tensor:
        """The actor's parameter ``name`` (one rank: its shard is the whole tensor), writable in place."""
        param = dict(self.actor.named_parameters())[name]
        return param.to_local() if hasattr(param, "to_local") else param.data

    @register(dispatch_mode=Dispatch.ONE_TO_ALL_RANK_ZERO)
    def perturb_every_weight(self, seed: int) -> None:
        generator = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for name, _ in self.actor.named_parameters():
                local = self._local(name)
                local.add_(torch.randn(local.shape, generator=generator) * 0.05)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL_RANK_ZERO)
    def scale_up_projection_of_one_expert(self, layer: int, expert: int, factor: float) -> None:
        """Multiply expert ``expert``'s up projection (the second half of its stacked gate/up rows) in ``layer``."""
        name = next(n for n, _ in self.actor.named_parameters() if f"layers.{layer}.mlp.experts.gate_up_proj" in n)
        width = self.text_config.moe_intermediate_size
        with torch.no_grad():
            gate_up = self._local(name)  # (experts, 2 x intermediate, hidden): gate rows, then up rows
            assert gate_up.shape[1] == 2 * width, gate_up.shape
            gate_up[expert, width:] *= factor

    @register(dispatch_mode=Dispatch.ONE_TO_ALL_RANK_ZERO)
    def sync(self) -> dict[str, float]:
        from easyrl.workers.fsdp_utils import iter_full_params_per_layer

        self.rollout.update_weights(iter_full_params_per_layer(self.actor))
        return self.rollout._last_sync_metrics

    @register(dispatch_mode=Dispatch.ONE_TO_ALL_RANK_ZERO)
    def log_probs(self) -> dict[str, list[float]]:
        """Log-probs of each token of the fixed sequence given the ones before it: the engine's and the actor's."""
        from vllm import SamplingParams

        ids = self.sequence
        params = SamplingParams(max_tokens=1, prompt_logprobs=0, temperature=1.0, detokenize=False)
        (output,) = self.rollout.llm.generate([{"prompt_token_ids": ids}], params, use_tqdm=False)
        engine = [output.prompt_logprobs[i][ids[i]].logprob for i in range(1, len(ids))]
        with torch.no_grad():
            logits = self.actor(input_ids=torch.tensor([ids]), use_cache=False).logits[0].float()
        actor = torch.log_softmax(logits[:-1], dim=-1).gather(-1, torch.tensor(ids[1:])[:, None])[:, 0]
        return {"engine": engine, "actor": actor.tolist()}


def _max_diff(a: list[float], b: list[float]) -> float:
    return max(abs(x - y) for x, y in zip(a, b, strict=True))


@pytest.fixture(scope="module")
def moe_models(tmp_path_factory) -> dict[str, str]:
    from easyrl.testing.tiny_moe import build_tiny_qwen3_moe, build_tiny_qwen3_vl_moe

    root = tmp_path_factory.mktemp("moe")
    return {
        "qwen3_moe": str(build_tiny_qwen3_moe(root / "qwen3_moe")),
        "qwen3_vl_moe": str(build_tiny_qwen3_vl_moe(root / "qwen3_vl_moe")),
    }


@pytest.fixture(scope="module", params=FAMILIES)
def probe(request, ray_cluster, moe_models):
    with worker_group(MoESyncProbe, name_prefix=f"{request.param}_sync") as group:
        group.setup(moe_models[request.param])
        yield group


@pytest.mark.timeout(300)
def test_engine_scores_what_the_actor_scores_before_and_after_syncs(probe):
    start = probe.log_probs()
    assert _max_diff(start["engine"], start["actor"]) < TOLERANCE  # the checkpoint's layout, read by both

    probe.perturb_every_weight(seed=1)
    metrics = probe.sync()
    synced = probe.log_probs()
    assert _max_diff(synced["actor"], start["actor"]) > 0.1, "the perturbation did not move the actor"
    assert _max_diff(synced["engine"], synced["actor"]) < TOLERANCE
    assert metrics["rollout/weight_sync_buckets"] >= 3  # per decoder layer (2) and the rest

    # a second sync on the same engine: the reload re-packs the experts again
    probe.perturb_every_weight(seed=2)
    probe.sync()
    again = probe.log_probs()
    assert _max_diff(again["actor"], synced["actor"]) > 0.1
    assert _max_diff(again["engine"], again["actor"]) < TOLERANCE


@pytest.mark.timeout(300)
def test_scaling_one_experts_up_projection_moves_the_engine_as_it_moves_the_actor(probe):
    probe.sync()  # whatever ran before: engine and actor agree
    before = probe.log_probs()
    assert _max_diff(before["engine"], before["actor"]) < TOLERANCE
    probe.scale_up_projection_of_one_expert(layer=0, expert=1, factor=4.0)
    probe.sync()
    after = probe.log_probs()
    # the expert is chosen for some tokens of the sequence: their log-probs move, the engine's with the actor's
    assert _max_diff(after["actor"], before["actor"]) > 0.05, "expert 1 of layer 0 never chosen: pick another"
    assert _max_diff(after["engine"], after["actor"]) < TOLERANCE


# ----------------------------------------------------------------------------------------------------------------------
# the released layout: read from transformers' mapping, written by the export and merge paths
# ----------------------------------------------------------------------------------------------------------------------
def test_in_place_transposes_come_from_transformers_mapping():
    from easyrl.models.checkpoint_layout import in_place_transposes, to_released_layout

    (gate_up, down) = sorted(in_place_transposes("qwen3_vl_moe"), key=lambda t: t.pattern.pattern, reverse=True)
    prefix = "model.language_model.layers.3.mlp.experts."
    assert gate_up.matches(prefix + "gate_up_proj") and down.matches(prefix + "down_proj")
    assert not gate_up.matches(prefix + "gate_up_proj_bias") and not down.matches(prefix + "down_proj.lora_A")
    # stacked experts of Qwen3-MoE are read by vLLM as transformers holds them; dense models have nothing
    assert in_place_transposes("qwen3_moe") == () and in_place_transposes("qwen2") == ()

    # (experts, 2 x intermediate, hidden) -> (experts, hidden, 2 x intermediate); a view, no copy
    stack = torch.arange(2 * 6 * 4, dtype=torch.float32).reshape(2, 6, 4)
    router = torch.ones(2, 4)
    named = [(prefix + "gate_up_proj", stack), (prefix.replace("experts.", "gate.weight"), router)]
    (_, released), (_, router_out) = to_released_layout("qwen3_vl_moe", named)
    assert released.shape == (2, 4, 6) and released[1, 3, 5] == stack[1, 5, 3]
    assert released.data_ptr() == stack.data_ptr()
    assert router_out is router


def _expert_shapes(folder) -> dict[str, tuple[int, ...]]:
    from safetensors.torch import load_file

    tensors = load_file(str(folder / "model.safetensors"))
    return {name: tuple(tensors[name].shape) for name in tensors if "layers.0.mlp.experts" in name}


def _assert_same_weights(model, folder) -> None:
    from transformers import AutoModelForImageTextToText

    reloaded = AutoModelForImageTextToText.from_pretrained(folder, dtype=torch.float32)
    expected = dict(model.named_parameters())
    for name, param in reloaded.named_parameters():
        assert torch.equal(param, expected[name]), name


def test_export_writes_the_released_expert_layout_and_reloads_in_transformers(tmp_path):
    from transformers import AutoModelForImageTextToText

    from easyrl.models.checkpoint_layout import save_pretrained_in_released_layout
    from easyrl.testing.tiny_moe import build_tiny_qwen3_vl_moe

    source = build_tiny_qwen3_vl_moe(tmp_path / "source", seed=3)
    model = AutoModelForImageTextToText.from_pretrained(source, dtype=torch.float32)
    live = model.model.language_model.layers[0].mlp.experts
    assert tuple(live.gate_up_proj.shape) == (4, 256, 64) and tuple(live.down_proj.shape) == (4, 64, 128)
    save_pretrained_in_released_layout(model, str(tmp_path / "export"))
    # as the released Qwen3-VL-MoE files: (experts, hidden, 2 x intermediate) and (experts, intermediate, hidden)
    assert _expert_shapes(tmp_path / "export") == {
        "model.language_model.layers.0.mlp.experts.gate_up_proj": (4, 64, 256),
        "model.language_model.layers.0.mlp.experts.down_proj": (4, 128, 64),
    }
    _assert_same_weights(model, tmp_path / "export")


def test_merge_writes_the_released_expert_layout(tmp_path):
    """`easyrl merge`'s path: a DCP role folder of a Qwen3-VL-MoE -> a folder in the released layout."""
    import torch.distributed.checkpoint as dcp
    from transformers import AutoModelForImageTextToText

    from easyrl.testing.tiny_moe import build_tiny_qwen3_vl_moe
    from easyrl.workers.fsdp_checkpoint import HF_FOLDER, merge_checkpoint_to_hf

    source = build_tiny_qwen3_vl_moe(tmp_path / "source", seed=4)
    model = AutoModelForImageTextToText.from_pretrained(source, dtype=torch.float32)
    role = tmp_path / "actor"
    dcp.save({"model": model.state_dict()}, checkpoint_id=str(role), no_dist=True)  # the in-memory layout
    model.config.architectures = [type(model).__name__]
    model.config.save_pretrained(role / HF_FOLDER)
    merge_checkpoint_to_hf(str(role), str(tmp_path / "merged"))
    shapes = _expert_shapes(tmp_path / "merged")
    assert shapes["model.language_model.layers.0.mlp.experts.gate_up_proj"] == (4, 64, 256)
    assert shapes["model.language_model.layers.0.mlp.experts.down_proj"] == (4, 128, 64)
    _assert_same_weights(model, tmp_path / "merged")


def test_reload_warnings_of_buffers_in_no_checkpoint_are_dropped_and_tying_is_read_from_either_config():
    import logging

    from easyrl.workers.rollout.weight_sync import ExpectedReloadWarnings, tied_embeddings

    def record(layer: str) -> logging.LogRecord:
        logger = "vllm.model_executor.model_loader.reload.layerwise"
        return logging.LogRecord(logger, logging.WARNING, "", 0, "%s: Failed to load weights", (layer,), None)

    untied = ExpectedReloadWarnings(tied_embeddings=False)
    assert not untied.filter(record("FusedMMInputNorm"))  # picture mean/std, computed from the processor
    assert untied.filter(record("RoutedExperts"))  # experts the stream missed still warn

    # Qwen3-VL says it ties its head only at the top of its config
    def config(text: dict, top: dict):
        return types.SimpleNamespace(
            hf_text_config=types.SimpleNamespace(**text), hf_config=types.SimpleNamespace(**top)
        )

    assert tied_embeddings(config({}, {"tie_word_embeddings": True}))
    assert not tied_embeddings(config({"tie_word_embeddings": False}, {"tie_word_embeddings": True}))
    assert not tied_embeddings(config({}, {}))
