"""Rollout-shaped vision-language batches for tests: prompts with images/videos encoded the way the dataset encodes
them, random responses, 3-D rope positions, and each sample's media in ``multi_modal_data``.

Also the per-sample reference: a plain Hugging Face forward of one unpadded sequence with the processor's own
outputs, where the model computes its 3-D positions itself.
"""

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from PIL import Image


@dataclass
class VLSample:
    """One prompt: its text and the pictures / videos ((frames, 3, H, W) uint8) it shows, in prompt order."""

    text: str
    images: list[Image.Image] = field(default_factory=list)
    videos: list[torch.Tensor] = field(default_factory=list)


def random_image(seed: int, width: int = 56, height: int = 84) -> Image.Image:
    return Image.fromarray((np.random.RandomState(seed).rand(height, width, 3) * 255).astype("uint8"))


def random_video(seed: int, frames: int = 4, width: int = 56, height: int = 56) -> torch.Tensor:
    """(frames, 3, height, width) uint8, as the dataset keeps sampled videos."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (frames, 3, height, width), generator=generator, dtype=torch.uint8)


def _messages(sample: VLSample) -> list[dict[str, Any]]:
    content = [{"type": "image"} for _ in sample.images] + [{"type": "video"} for _ in sample.videos]
    return [{"role": "user", "content": [*content, {"type": "text", "text": sample.text}]}]


def processor_inputs(processor: Any, sample: VLSample) -> dict[str, torch.Tensor]:
    """The processor's outputs for one prompt (expanded vision pads), as ``RowEncoder.encode`` calls it."""
    from transformers.video_utils import VideoMetadata

    text = processor.apply_chat_template(_messages(sample), add_generation_prompt=True, tokenize=False)
    kwargs: dict[str, Any] = {}
    if sample.videos:
        # frames already sampled (at 2 fps): the processor must take all of them
        kwargs["video_metadata"] = [
            VideoMetadata(total_num_frames=len(v), fps=2.0, frames_indices=list(range(len(v)))) for v in sample.videos
        ]
        kwargs["do_sample_frames"] = False
    if sample.images or sample.videos:
        return dict(
            processor(
                text=[text],
                images=sample.images or None,
                videos=sample.videos or None,
                add_special_tokens=False,
                return_tensors="pt",
                return_mm_token_type_ids=True,
                **kwargs,
            )
        )
    return dict(processor.tokenizer([text], add_special_tokens=False, return_tensors="pt"))


def make_vl_batch(processor: Any, model_path: str, samples: list[VLSample], response_length: int = 6, seed: int = 0):
    """A DataProto as the rollout returns it: left-padded prompts ++ right-padded random responses, 3-D rope
    ``position_ids`` (batch, 3, seq) continuing over the response, ``multi_modal_data`` for rows with media."""
    from ..data.rope import make_position_id_fn
    from ..protocol import DataProto

    position_fn = make_position_id_fn(processor, model_path=model_path)
    generator = torch.Generator().manual_seed(seed)
    encoded = [processor_inputs(processor, sample) for sample in samples]
    prompt_length = max(e["input_ids"].shape[-1] for e in encoded)
    vocab = processor.tokenizer.convert_tokens_to_ids("<|vision_start|>")  # ordinary text tokens lie below
    batch = len(samples)
    seq = prompt_length + response_length
    input_ids = torch.zeros(batch, seq, dtype=torch.long)
    attention_mask = torch.zeros(batch, seq, dtype=torch.long)
    position_ids = torch.zeros(batch, 3, seq, dtype=torch.long)
    responses = torch.zeros(batch, response_length, dtype=torch.long)
    multi_modal = np.empty(batch, dtype=object)
    for i, (sample, inputs) in enumerate(zip(samples, encoded)):
        prompt = inputs["input_ids"][0]
        n_prompt = prompt.shape[-1]
        n_response = int(torch.randint(1, response_length + 1, (1,), generator=generator))
        response = torch.randint(5, vocab, (n_response,), generator=generator)
        prompt_positions = position_fn(inputs)  # (3, n_prompt)
        start = prompt_length - n_prompt
        input_ids[i, start:prompt_length] = prompt
        input_ids[i, prompt_length : prompt_length + n_response] = response
        responses[i, :n_response] = response
        attention_mask[i, start : prompt_length + n_response] = 1
        position_ids[i, :, start:prompt_length] = prompt_positions
        continued = prompt_positions[:, -1:] + torch.arange(1, response_length + 1)  # (3, response_length)
        position_ids[i, :, prompt_length:] = continued
        media = {"images": sample.images, "videos": sample.videos}
        multi_modal[i] = {key: value for key, value in media.items() if value} or None
    tensors = {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "position_ids": position_ids,
        "responses": responses,
        "response_mask": attention_mask[:, prompt_length:],
    }
    return DataProto.from_dict(
        tensors=tensors, non_tensors={"multi_modal_data": multi_modal}, meta_info={"temperature": 1.0}
    )


def reference_log_probs(model, processor: Any, samples: list[VLSample], data, temperature: float) -> torch.Tensor:
    """(batch, response_len) log-probs from a plain HF forward of each sequence alone, unpadded, given the batch's
    rope positions (easyrl's; tests/test_data_vision.py checks them against the model's own). A vision pad token in
    a response is fed as text (easyrl.models.vision.text_token_for_sampled_pads) and scored as itself."""

    def log_probs(logits: torch.Tensor, response: torch.Tensor) -> torch.Tensor:
        return torch.log_softmax(logits / temperature, dim=-1).gather(-1, response[:, None]).squeeze(-1)

    return reference_outputs(model, processor, samples, data, log_probs)


def reference_outputs(model, processor: Any, samples: list[VLSample], data, per_token) -> torch.Tensor:
    """(batch, response_len) of ``per_token(logits, response)``: the fp32 outputs at the positions that predict each
    response token, of a plain HF forward of each sequence alone (see ``reference_log_probs``); a critic's values are
    ``logits[:, 0]``."""
    from ..models.vision import text_token_for_sampled_pads

    pads = torch.tensor([processor.image_token_id, processor.video_token_id])
    response_length = data.batch["responses"].shape[-1]
    prompt_length = data.batch["input_ids"].shape[-1] - response_length
    out = torch.zeros(data.batch["responses"].shape)
    for i, sample in enumerate(samples):
        inputs = processor_inputs(processor, sample)
        n_response = int(data.batch["response_mask"][i].sum())
        n_prompt = inputs["input_ids"].shape[-1]
        positions = data.batch["position_ids"][i, :, prompt_length - n_prompt : prompt_length + n_response]
        inputs["position_ids"] = positions.unsqueeze(1)  # (3, 1, n_prompt + n_response)
        response = data.batch["responses"][i, :n_response]
        fed = torch.where(torch.isin(response, pads), text_token_for_sampled_pads(processor), response)
        inputs["input_ids"] = torch.cat([inputs["input_ids"], fed[None]], dim=-1)
        inputs["attention_mask"] = torch.ones_like(inputs["input_ids"])
        if "mm_token_type_ids" in inputs:
            inputs["mm_token_type_ids"] = torch.nn.functional.pad(inputs["mm_token_type_ids"], (0, n_response))
        with torch.no_grad():
            logits = model(**inputs, use_cache=False).logits[0].float()
        out[i, :n_response] = per_token(logits[-n_response - 1 : -1], response)
    assert out.shape[-1] == response_length
    return out
