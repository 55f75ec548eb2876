"""vLLM rollout of a tiny random Qwen2.5-VL: image prompts with ONE pad token per image, HF-named VLM weights
(``model.language_model.*`` / ``model.visual.*``) streamed into a dummy-initialised engine, 3-row rope positions.

The engine runs in a Ray worker so that vLLM's process-wide state stays out of the test process.
"""

import numpy as np
import pytest
import torch

import easyrl  # noqa: F401  (process environment before Ray starts)
from easyrl.controller import Dispatch, Worker, register
from easyrl.workers.rollout.base import GenerationRequest
from tests.fsdp_helpers import worker_group


RESPONSE_LENGTH = 8


def _perturbed(model, seed: int) -> None:
    """Larger random weights than the initialiser's, so that greedy answers depend on every weight."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(torch.randn(param.shape, generator=generator) * 0.2)


class VisionRolloutProbe(Worker):
    """Hosts the engine and an HF copy of the same weights, and answers with both greedy outputs."""

    @register(dispatch_mode=Dispatch.ONE_TO_ALL_RANK_ZERO)
    def setup(self, model_path: str) -> None:
        from transformers import Qwen2_5_VLForConditionalGeneration

        from easyrl.config import RolloutConfig
        from easyrl.testing.tiny_vl import tiny_vl_processor
        from easyrl.workers.rollout.vllm_rollout import VLLMRollout

        self.processor = tiny_vl_processor()
        self.model = Qwen2_5_VLForConditionalGeneration.from_pretrained(model_path, dtype=torch.float32)
        config = RolloutConfig(
            dtype="fp32",
            tensor_parallel_size=1,
            enforce_eager=True,
            kv_cache_memory_bytes=64 << 20,
            limit_images=1,
            prompt_length=64,
            response_length=RESPONSE_LENGTH,
            disable_tqdm=True,
        )
        self.rollout = VLLMRollout(model_path, config, self.processor.tokenizer, rank=self.rank, world_size=1)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL_RANK_ZERO)
    def perturb_and_sync(self, seed: int) -> list[str]:
        """New weights in the HF model, streamed into the engine under their HF names; returns those names."""
        _perturbed(self.model, seed)
        named = [(name, param.detach()) for name, param in self.model.named_parameters()]
        self.rollout.update_weights(iter([named]))
        return [name for name, _ in named]

    @register(dispatch_mode=Dispatch.ONE_TO_ALL_RANK_ZERO)
    def generate_both(self, seed: int) -> dict:
        from PIL import Image

        from easyrl.protocol import DataProto

        image = Image.fromarray((np.random.RandomState(seed).rand(56, 84, 3) * 255).astype("uint8"))
        messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Describe it."}]}]
        text = self.processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        raw_prompt_ids = self.processor.tokenizer(text, add_special_tokens=False)["input_ids"]  # one image pad
        hf_inputs = self.processor(text=[text], images=[image], return_tensors="pt", return_mm_token_type_ids=True)
        position_ids, _ = self.model.model.get_rope_index(
            hf_inputs["input_ids"],
            hf_inputs["mm_token_type_ids"],
            hf_inputs["image_grid_thw"],
            attention_mask=hf_inputs["attention_mask"],
        )  # (3, batch, prompt_len)
        with torch.no_grad():
            hf_ids = self.model.generate(
                **hf_inputs, max_new_tokens=RESPONSE_LENGTH, do_sample=False, eos_token_id=None
            )[0, hf_inputs["input_ids"].shape[1] :]
        raw, images = np.empty(1, dtype=object), np.empty(1, dtype=object)
        raw[0], images[0] = raw_prompt_ids, {"images": [image]}
        prompts = DataProto.from_dict(
            tensors={
                "input_ids": hf_inputs["input_ids"],
                "attention_mask": hf_inputs["attention_mask"],
                "position_ids": position_ids.transpose(0, 1),  # (batch, 3, prompt_len)
            },
            non_tensors={"raw_prompt_ids": raw, "multi_modal_data": images},
        )
        out = self.rollout.generate_sequences(
            prompts, GenerationRequest(sampling_override={"temperature": 0.0, "ignore_eos": True})
        )
        return {
            "vllm": out.batch["responses"][0].tolist(),
            "hf": hf_ids.tolist(),
            "prompt_positions": position_ids.transpose(0, 1)[0],
            "positions": out.batch["position_ids"][0],
        }


@pytest.fixture(scope="module")
def probe(ray_cluster, tmp_path_factory):
    from easyrl.testing.tiny_vl import build_tiny_qwen2_5_vl

    path = build_tiny_qwen2_5_vl(tmp_path_factory.mktemp("tiny_vl"))
    with worker_group(VisionRolloutProbe, name_prefix="vl_rollout") as group:
        group.setup(str(path))
        yield group


@pytest.mark.timeout(300)
def test_image_prompt_greedy_equals_hf_after_syncing_hf_named_weights(probe):
    names = probe.perturb_and_sync(seed=1)
    assert any(n.startswith("model.visual.") for n in names)
    assert any(n.startswith("model.language_model.") for n in names)
    out = probe.generate_both(seed=0)
    assert out["vllm"] == out["hf"]


@pytest.mark.timeout(300)
def test_new_weights_reach_the_vision_encoder_output(probe):
    before = probe.generate_both(seed=0)
    probe.perturb_and_sync(seed=2)
    after = probe.generate_both(seed=0)  # same image: a stale encoder cache would reuse old vision embeddings
    assert after["hf"] != before["hf"]
    assert after["vllm"] == after["hf"]


@pytest.mark.timeout(300)
def test_rope_positions_continue_each_of_the_three_rows(probe):
    out = probe.generate_both(seed=0)
    prompt_length = out["prompt_positions"].shape[-1]
    assert out["positions"].shape == (3, prompt_length + RESPONSE_LENGTH)
    expected = out["prompt_positions"][:, -1:] + torch.arange(1, RESPONSE_LENGTH + 1)
    assert torch.equal(out["positions"][:, prompt_length:], expected)
