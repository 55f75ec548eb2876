"""The actor's LoRA adapters reaching the vLLM engine (easyrl/workers/rollout/lora_sync.py), checked on values.

A LoRA-wrapped actor (peft, one-rank FSDP2, B initialised randomly so the adapter changes the outputs) and a vLLM
engine started from the same base checkpoint live in one Ray worker (vLLM's process-wide state stays out of the test
process). After each sync, the log-probs vLLM reports for its own samples equal the actor's log-probs of those
samples (fp32 on both sides: measured differences ~1e-6; a missing scaling, a wrong q/k/v packing or a stale adapter
moves them by 0.05 or more). Both routes: the adapter handed over in memory, and merged weights as the fallback.
"""

from contextlib import contextmanager

import numpy as np
import pytest
import torch

import easyrl  # noqa: F401  (process environment before Ray starts)
from easyrl.controller import Dispatch, Worker, register
from tests.fsdp_helpers import worker_group


TOLERANCE = 1e-3
RANK, ALPHA = 8, 16
RESPONSE_LENGTH = 12
# tiny qwen2 (tests/fixtures/models.py): hidden 64, 2 layers, 2 heads of 32 (1 kv head), intermediate 128. Rank-8
# adapter elements per layer: q 8x64 + 64x8, k and v 8x64 + 32x8 each, o 8x64 + 64x8, gate and up 8x64 + 128x8 each,
# down 8x128 + 64x8 = 1024 + 768 + 768 + 1024 + 1536 + 1536 + 1536 = 8192; two layers, fp32
TINY_ADAPTER_BYTES = 2 * 8192 * 4


class LoraRolloutProbe(Worker):
    """A LoRA actor (FSDP2 on one rank) and a vLLM engine on the same base checkpoint, in one process."""

    @register(dispatch_mode=Dispatch.ONE_TO_ALL_RANK_ZERO)
    def setup(self, model_path: str, lora_sync: str, vision: bool = False, vision_tower: bool = False) -> dict:
        from transformers import AutoModelForCausalLM, AutoModelForImageTextToText, AutoTokenizer

        from easyrl.config import FSDPConfig, RolloutConfig
        from easyrl.config.schema import LoraConfig
        from easyrl.models.lora import apply_lora
        from easyrl.workers.fsdp_utils import apply_fsdp2, build_device_mesh
        from easyrl.workers.rollout.lora_sync import actor_lora
        from easyrl.workers.rollout.vllm_rollout import VLLMRollout

        self.model_path, self.vision = model_path, vision
        model_cls = AutoModelForImageTextToText if vision else AutoModelForCausalLM
        model = model_cls.from_pretrained(model_path, dtype=torch.float32)
        lora_config = LoraConfig(rank=RANK, alpha=ALPHA, vision_tower=vision_tower)
        self.actor = apply_lora(model, lora_config, is_vision_language=vision)
        self._randomise_adapter(seed=0, b_scale=0.3)
        apply_fsdp2(self.actor, build_device_mesh(1, -1), FSDPConfig(mp_param_dtype="fp32"))
        if vision:
            from easyrl.testing.tiny_vl import tiny_vl_processor

            self.processor = tiny_vl_processor()
            self.tokenizer = self.processor.tokenizer
        else:
            self.tokenizer = AutoTokenizer.from_pretrained(model_path)
        rollout_config = RolloutConfig(
            dtype="fp32",
            tensor_parallel_size=1,
            enforce_eager=True,
            kv_cache_memory_bytes=64 << 20,
            limit_images=1 if vision else 0,
            prompt_length=64 if vision else 16,
            response_length=RESPONSE_LENGTH,
            disable_tqdm=True,
            seed=3,
            lora_sync=lora_sync,
        )
        self.rollout = VLLMRollout(
            model_path, rollout_config, self.tokenizer, rank=self.rank, world_size=1, lora=actor_lora(self.actor)
        )
        unserved = []
        if self.rollout.lora_route == "merged" and lora_sync == "auto":
            names = list(actor_lora(self.actor).module_names)
            (unserved,) = self.rollout.llm.collective_rpc("easyrl_unserved_lora_modules", args=(names,))
        return {"route": self.rollout.lora_route, "unserved": unserved}

    def _adapter_params(self):
        for name, param in self.actor.named_parameters():
            if ".lora_A." in name or ".lora_B." in name:
                yield name, param.to_local() if hasattr(param, "to_local") else param.data

    @torch.no_grad()
    def _randomise_adapter(self, seed: int, b_scale: float, a_scale: float = 0.0) -> None:
        generator = torch.Generator().manual_seed(seed)
        for name, local in self._adapter_params():
            scale = b_scale if ".lora_B." in name else a_scale
            if scale:
                local.add_(torch.randn(local.shape, generator=generator) * scale)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL_RANK_ZERO)
    def perturb_adapter(self, seed: int) -> None:
        """A step's worth of change, on A and B alike (an update moves both)."""
        self._randomise_adapter(seed, b_scale=0.2, a_scale=0.2)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL_RANK_ZERO)
    @torch.no_grad()
    def zero_adapter(self) -> None:
        for name, local in self._adapter_params():
            if ".lora_B." in name:
                local.zero_()

    @register(dispatch_mode=Dispatch.ONE_TO_ALL_RANK_ZERO)
    def sync(self) -> dict[str, float]:
        from easyrl.workers.rollout.lora_sync import sync_actor_weights

        sync_actor_weights(self.actor, self.rollout, torch.float32)
        return dict(self.rollout._last_sync_metrics)

    def _prompts(self):
        from tests.rollout_helpers import make_prompts

        if not self.vision:
            return make_prompts(self.tokenizer), None
        from PIL import Image

        from easyrl.protocol import DataProto

        image = Image.fromarray((np.random.RandomState(0).rand(56, 84, 3) * 255).astype("uint8"))
        messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Describe it."}]}]
        text = self.processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        raw_ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]  # one image pad: what vLLM expects
        hf_inputs = self.processor(text=[text], images=[image], return_tensors="pt", return_mm_token_type_ids=True)
        raw, media = np.empty(1, dtype=object), np.empty(1, dtype=object)
        raw[0], media[0] = raw_ids, {"images": [image]}
        prompts = DataProto.from_dict(
            tensors={
                "input_ids": torch.tensor([raw_ids]),
                "attention_mask": torch.ones(1, len(raw_ids), dtype=torch.long),
                "position_ids": torch.arange(len(raw_ids))[None],
            },
            non_tensors={"raw_prompt_ids": raw, "multi_modal_data": media},
        )
        return prompts, dict(hf_inputs)

    @torch.no_grad()
    def _actor_log_probs(self, model, prompts, hf_inputs, responses: list[list[int]]) -> list[list[float]]:
        """log p(response token | prompt, earlier response tokens) from a plain forward of each sequence alone."""
        out = []
        for i, response in enumerate(responses):
            if hf_inputs is None:
                inputs = {"input_ids": torch.tensor([list(prompts.non_tensor_batch["raw_prompt_ids"][i]) + response])}
            else:  # the processor's expanded image pads; the model computes its 3-D rope positions itself
                inputs = dict(hf_inputs)
                inputs["input_ids"] = torch.cat([hf_inputs["input_ids"], torch.tensor([response])], dim=-1)
                inputs["attention_mask"] = torch.ones_like(inputs["input_ids"])
                inputs["mm_token_type_ids"] = torch.nn.functional.pad(
                    hf_inputs["mm_token_type_ids"], (0, len(response))
                )
            logits = model(**inputs, use_cache=False).logits[0, -len(response) - 1 : -1].float()
            out.append(torch.log_softmax(logits, -1).gather(-1, torch.tensor(response)[:, None])[:, 0].tolist())
        return out

    @register(dispatch_mode=Dispatch.ONE_TO_ALL_RANK_ZERO)
    def sample_and_score(self) -> dict:
        """The engine's samples (temperature 1) with its log-probs, the actor's log-probs of them with and without its
        adapter, and a freshly loaded base model's (the checkpoint on disk, never touched by a sync)."""
        from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

        from easyrl.models.lora import adapter_disabled

        prompts, hf_inputs = self._prompts()
        out = self.rollout.generate_sequences(prompts)
        mask = out.batch["response_mask"].bool()
        responses = [row[m].tolist() for row, m in zip(out.batch["responses"], mask)]
        engine = [row[m].tolist() for row, m in zip(out.batch["rollout_log_probs"], mask)]
        actor = self._actor_log_probs(self.actor, prompts, hf_inputs, responses)
        with adapter_disabled(self.actor):
            actor_base = self._actor_log_probs(self.actor, prompts, hf_inputs, responses)
        model_cls = AutoModelForImageTextToText if self.vision else AutoModelForCausalLM
        base = model_cls.from_pretrained(self.model_path, dtype=torch.float32)
        disk_base = self._actor_log_probs(base, prompts, hf_inputs, responses)
        return {"responses": responses, "engine": engine, "actor": actor, "actor_base": actor_base, "disk": disk_base}


def _max_diff(a: list[list[float]], b: list[list[float]]) -> float:
    return max(abs(x - y) for row_a, row_b in zip(a, b, strict=True) for x, y in zip(row_a, row_b, strict=True))


@contextmanager
def _probe(model_path, lora_sync: str, **kwargs):
    """A one-worker probe set up for ``lora_sync``: (group, what setup reports)."""
    with worker_group(LoraRolloutProbe, name_prefix=f"lora_{lora_sync}") as group:
        yield group, group.setup(str(model_path), lora_sync, **kwargs)


@pytest.fixture(scope="module")
def adapter_probe(ray_cluster, tiny_model_path):
    with _probe(tiny_model_path, "auto") as (group, info):
        assert info["route"] == "adapter"
        yield group


@pytest.mark.timeout(300)
def test_engine_log_probs_equal_the_lora_actors_before_and_after_an_adapter_update(adapter_probe):
    metrics = adapter_probe.sync()
    # the adapter's bytes moved, not the model's (hand-counted in TINY_ADAPTER_BYTES)
    assert metrics["rollout/weight_sync_bytes"] == TINY_ADAPTER_BYTES
    first = adapter_probe.sample_and_score()
    assert _max_diff(first["engine"], first["actor"]) < TOLERANCE
    assert _max_diff(first["actor"], first["actor_base"]) > 0.05, "the random B did not make the adapter matter"

    adapter_probe.perturb_adapter(seed=1)
    adapter_probe.sync()
    second = adapter_probe.sample_and_score()
    assert _max_diff(second["engine"], second["actor"]) < TOLERANCE
    if first["responses"] == second["responses"]:  # same samples: the update moved their log-probs
        assert _max_diff(second["actor"], first["actor"]) > 0.05


@pytest.mark.timeout(300)
def test_an_adapter_sync_leaves_the_engines_base_weights_as_loaded(adapter_probe):
    adapter_probe.perturb_adapter(seed=2)
    adapter_probe.sync()
    adapter_probe.zero_adapter()
    adapter_probe.sync()
    zeroed = adapter_probe.sample_and_score()
    # B = 0: the adapter adds nothing, so the engine is its base weights, which must be the checkpoint's still
    assert _max_diff(zeroed["engine"], zeroed["disk"]) < TOLERANCE
    assert _max_diff(zeroed["actor"], zeroed["disk"]) < 1e-5


def test_engine_max_lora_rank_is_the_smallest_vllm_serves():
    from easyrl.workers.rollout.lora_sync import engine_max_lora_rank

    assert [engine_max_lora_rank(r) for r in (1, 2, 8, 9, 64, 300, 512, 513)] == [1, 8, 8, 16, 64, 320, 512, None]


def test_a_fallback_to_merged_weights_names_the_settings_that_keep_or_choose_a_route(caplog):
    """Vision-tower adapters vLLM does not serve: the warning (auto) and the refusal (adapter) name
    lora.vision_tower=false, with which the adapter goes to the engine; the warning read like a note to ourselves."""
    import logging
    from types import SimpleNamespace

    from easyrl.config.schema import RolloutConfig
    from easyrl.workers.rollout.vllm_rollout import VLLMRollout

    reason = "vLLM's LoRA does not serve the adapters of model.visual.blocks.0.attn.qkv"
    setting = "worker.actor.model.lora.vision_tower=false (adapters on the language model only)"
    engine = SimpleNamespace(config=RolloutConfig(lora_sync="auto"), lora_route="adapter")
    with caplog.at_level(logging.WARNING, logger="easyrl.workers.rollout.vllm_rollout"):
        VLLMRollout._lora_falls_back(engine, reason, setting)
    assert engine.lora_route == "merged"
    assert caplog.records[-1].getMessage() == (
        f"LoRA: the rollout engine gets MERGED weights after each update (a full-model sync), not the adapter: "
        f"{reason}. Set {setting} for the adapter route. Set worker.rollout.lora_sync=merged to choose this route "
        "without this warning."
    )
    engine.config.lora_sync = "adapter"
    with pytest.raises(ValueError) as error:
        VLLMRollout._lora_falls_back(engine, reason, setting)
    assert str(error.value).endswith(f"into the engine instead. Set {setting} for the adapter route.")


# ----------------------------------------------------------------------------------------------------------------------
# the merged route (the fallback): merged weights through the per-layer stream
# ----------------------------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def merged_probe(ray_cluster, tiny_model_path):
    with _probe(tiny_model_path, "merged") as (group, info):
        assert info["route"] == "merged"
        yield group


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_merged_route_engine_log_probs_equal_the_lora_actors_before_and_after_an_update(merged_probe):
    metrics = merged_probe.sync()
    # the whole (tied, so embedding once) model moved: far more than the adapter
    assert metrics["rollout/weight_sync_bytes"] > 10 * TINY_ADAPTER_BYTES
    first = merged_probe.sample_and_score()
    assert _max_diff(first["engine"], first["actor"]) < TOLERANCE
    assert _max_diff(first["actor"], first["actor_base"]) > 0.05
    merged_probe.perturb_adapter(seed=1)
    merged_probe.sync()
    second = merged_probe.sample_and_score()
    assert _max_diff(second["engine"], second["actor"]) < TOLERANCE


def test_merged_buckets_equal_peft_merge_and_unload_under_checkpoint_names(tiny_model_path):
    """The fallback's stream, from a one-rank FSDP2 LoRA model: the base checkpoint's names (tied head once), each
    adapted weight W + (alpha / r) B A as peft's own merge computes it."""
    import copy

    from transformers import AutoModelForCausalLM

    from easyrl.config import FSDPConfig
    from easyrl.config.schema import LoraConfig
    from easyrl.models.lora import apply_lora
    from easyrl.testing.single_rank import one_rank_process_group
    from easyrl.workers.fsdp_utils import apply_fsdp2, build_device_mesh
    from easyrl.workers.rollout.lora_sync import merged_weight_buckets

    base = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32)
    checkpoint_names = {name for name, _ in base.named_parameters()}
    q_proj = "model.layers.1.self_attn.q_proj.weight"
    q_proj_before = base.get_parameter(q_proj).detach().clone()
    model = apply_lora(base, LoraConfig(rank=RANK, alpha=ALPHA), is_vision_language=False)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if ".lora_B." in name:
                param.copy_(torch.randn(param.shape, generator=generator))
    expected = copy.deepcopy(model).merge_and_unload().state_dict()
    with one_rank_process_group():
        apply_fsdp2(model, build_device_mesh(1, -1), FSDPConfig(mp_param_dtype="fp32"))
        buckets = list(merged_weight_buckets(model, torch.float32))
    merged = dict(pair for bucket in buckets for pair in bucket)
    assert len(buckets) == 3  # two decoder layers, then the rest
    assert set(merged) == checkpoint_names
    assert (merged[q_proj] - q_proj_before).abs().max() > 0.1  # the adapter is in
    for name, tensor in merged.items():
        torch.testing.assert_close(tensor, expected[name], atol=1e-6, rtol=1e-6)


def test_hf_rollout_generates_with_the_peft_wrapped_actor(tiny_model_path, tokenizer):
    """worker.rollout.name=hf generates with the actor module itself: its log-probs are the LoRA model's."""
    from transformers import AutoModelForCausalLM

    from easyrl.config import RolloutConfig
    from easyrl.config.schema import LoraConfig
    from easyrl.models.lora import adapter_disabled, apply_lora
    from easyrl.workers.rollout.hf_rollout import HFRollout
    from tests.rollout_helpers import make_prompts

    model = apply_lora(
        AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32),
        LoraConfig(rank=RANK, alpha=ALPHA),
        is_vision_language=False,
    )
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if ".lora_B." in name:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.3)
    config = RolloutConfig(name="hf", prompt_length=16, response_length=6, seed=1)
    prompts = make_prompts(tokenizer)
    out = HFRollout(model, config, tokenizer).generate_sequences(prompts)
    mask = out.batch["response_mask"].bool()
    for i, ids in enumerate(prompts.non_tensor_batch["raw_prompt_ids"]):
        response = out.batch["responses"][i][mask[i]]
        sequence = torch.tensor([list(ids) + response.tolist()])
        with torch.no_grad():
            logits = model(input_ids=sequence).logits[0, -len(response) - 1 : -1]
            with adapter_disabled(model):
                base_logits = model(input_ids=sequence).logits[0, -len(response) - 1 : -1]
        actor = torch.log_softmax(logits, -1).gather(-1, response[:, None])[:, 0]
        base = torch.log_softmax(base_logits, -1).gather(-1, response[:, None])[:, 0]
        torch.testing.assert_close(out.batch["rollout_log_probs"][i][mask[i]], actor, atol=1e-4, rtol=0)
        assert (actor - base).abs().max() > 0.05


# ----------------------------------------------------------------------------------------------------------------------
# a vision-language model: a picture in the prompt, adapters on the language model (the default)
# ----------------------------------------------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.timeout(400)
def test_vl_text_adapters_go_to_the_engine_and_its_log_probs_equal_the_actors(ray_cluster, tiny_vl_model_path):
    with _probe(tiny_vl_model_path, "auto", vision=True) as (probe, info):
        assert info["route"] == "adapter"
        metrics = probe.sync()
        assert metrics["rollout/weight_sync_buckets"] == 1
        first = probe.sample_and_score()
        assert _max_diff(first["engine"], first["actor"]) < TOLERANCE
        assert _max_diff(first["actor"], first["actor_base"]) > 0.05
        probe.perturb_adapter(seed=1)
        probe.sync()
        second = probe.sample_and_score()
        assert _max_diff(second["engine"], second["actor"]) < TOLERANCE


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_vision_tower_adapters_fall_back_to_merged_weights_and_still_agree(ray_cluster, tiny_vl_model_path):
    """vLLM's LoRA does not serve Qwen2.5-VL's vision blocks: `auto` detects it after the engine starts and streams
    merged weights (vision blocks included) instead."""
    with _probe(tiny_vl_model_path, "auto", vision=True, vision_tower=True) as (probe, info):
        assert info["route"] == "merged"
        assert any(name.startswith("model.visual.") for name in info["unserved"])
        assert not any(name.startswith("model.language_model.") for name in info["unserved"])
        probe.sync()
        first = probe.sample_and_score()
        assert _max_diff(first["engine"], first["actor"]) < TOLERANCE
        assert _max_diff(first["actor"], first["actor_base"]) > 0.05


# ----------------------------------------------------------------------------------------------------------------------
# the worker path: 2 FSDP2 ranks (the training side's LoRA wrapping), each with its own engine
# ----------------------------------------------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("tensor_parallel_size", [1, 2], ids=["two_engines", "one_tp2_engine"])
def test_two_fsdp_workers_sync_only_the_adapter_and_score_what_their_engines_sample(
    ray_cluster, tiny_model_path, tensor_parallel_size
):
    """Two data-parallel engines, or one engine split over both ranks (vLLM slices the adapter for each rank)."""
    from easyrl.testing.tiny_models import tiny_tokenizer
    from easyrl.workers.fsdp_worker import FSDPWorker
    from easyrl.workers.rollout.base import rollout_logprob_mismatch
    from tests.rollout_helpers import make_prompts, rollout_worker_config, update_actor_once

    config = rollout_worker_config(tiny_model_path, 2, tensor_parallel_size=tensor_parallel_size)
    config.actor.model.lora.rank, config.actor.model.lora.alpha = RANK, ALPHA
    with worker_group(
        FSDPWorker, config, "actor_rollout", processes=2, name_prefix="lora_fsdp", process_group_timeout_s=240
    ) as group:
        group.init_model()
        prompts = make_prompts(tiny_tokenizer())

        def mismatch(out) -> float:
            actor = group.compute_log_probs(out).batch["old_log_probs"]
            diff = rollout_logprob_mismatch(actor, out.batch["rollout_log_probs"], out.batch["response_mask"])
            return diff["rollout/logprob_abs_diff/max"]

        before = group.generate_sequences(prompts)
        assert mismatch(before) < TOLERANCE  # B = 0 at the start: the engine's base weights are the actor
        update_actor_once(group, seed=1)  # lr 1 SGD: B leaves zero, the adapter starts to matter
        after = group.generate_sequences(prompts)
        assert after.meta_info["metrics"]["rollout/weight_sync_bytes"] == TINY_ADAPTER_BYTES
        assert mismatch(after) < TOLERANCE
        # the update moved the log-probs of the samples drawn before it: a stale engine would have failed above
        assert mismatch(before) > 0.05


def _refusals_before_start(model_path: str) -> dict[str, str | None]:
    """The detection rule's first half on the tiny qwen2's config, for a few adapters (runs in a Ray task: it
    imports vLLM's model registry)."""
    from transformers import AutoConfig

    from easyrl.workers.rollout.lora_sync import ActorLora, adapter_refusal_before_start

    hf_config = AutoConfig.from_pretrained(model_path)
    plain = {"r": 8, "lora_alpha": 16, "target_modules": ["q_proj"]}
    adapters = {
        "plain": plain,
        "dora": {**plain, "use_dora": True},
        "rank_600": {**plain, "r": 600},
    }
    refusals = {
        name: adapter_refusal_before_start(
            ActorLora(config["r"], config, ("model.layers.0.self_attn.q_proj",)), hf_config
        )
        for name, config in adapters.items()
    }
    hf_config.architectures = ["NoSuchForCausalLM"]
    refusals["unknown_class"] = adapter_refusal_before_start(ActorLora(8, plain, ()), hf_config)
    return refusals


@pytest.mark.timeout(300)
def test_auto_refuses_before_start_what_vllms_lora_cannot_serve(ray_cluster, tiny_model_path):
    refusals = ray_cluster.get(ray_cluster.remote(_refusals_before_start).remote(str(tiny_model_path)))
    assert refusals["plain"] is None  # Qwen2ForCausalLM implements LoRA in vLLM
    assert "DoRA" in refusals["dora"]
    assert "above the largest vLLM serves (512)" in refusals["rank_600"]
    assert "no class of its own" in refusals["unknown_class"]
