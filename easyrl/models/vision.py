"""Vision-language models in the FSDP worker: which class loads them, where their vision tower sits, and the
pixel inputs of one micro-batch.

Qwen2-VL, Qwen2.5-VL and Qwen3-VL (arXiv 2409.12191, 2502.13923, 2511.21631) are image-text-to-text models: a ViT
encodes each picture (or video) into tokens that replace the vision pad tokens of the prompt, and the language model
attends over both with 3-D (temporal, height, width) rotary positions. Rows carry their media as
``multi_modal_data`` {"images": [PIL], "videos": [(frames, 3, H, W) uint8]}; the pixel tensors are built here, per
micro-batch and in sample order, so that a sequence only ever meets its own pictures however the batch is cut or
reordered (micro-batches, dynamic batching).
"""

import weakref
from dataclasses import dataclass, field
from typing import Any

import torch


MULTI_MODAL_KEY = "multi_modal_data"


# ----------------------------------------------------------------------------------------------------------------------
# model class and vision tower
# ----------------------------------------------------------------------------------------------------------------------
def is_vision_language_config(hf_config: Any) -> bool:
    """True for configs of image-text-to-text models (those with a vision sub-config)."""
    return getattr(hf_config, "vision_config", None) is not None


def resolve_vision_language_class(hf_config: Any, kind: str) -> type | None:
    """The image-text-to-text class for a VLM actor, reference or critic (``kind`` "value": transformers has no VLM
    class with a value head, so the critic loads the image-text-to-text model and ``use_value_head`` gives it one);
    None for text models."""
    if kind not in ("causal_lm", "value") or not is_vision_language_config(hf_config):
        return None
    from transformers import AutoModelForImageTextToText

    # the Auto class itself: it offers from_config as well as from_pretrained
    return AutoModelForImageTextToText if type(hf_config) in AutoModelForImageTextToText._model_mapping else None


def use_value_head(model: torch.nn.Module) -> None:
    """Turn an image-text-to-text model into a value model (PPO's critic): its LM head becomes a one-output linear
    head, initialised as transformers initialises a text model's token-classification head (normal with the
    config's initializer_range, zero bias), so ``.logits`` is (batch, tokens, 1), the value of each position.

    The head is untied from the input embeddings (small VLMs tie them). Its initial weights come from a fixed seed,
    so every rank draws the same head; on the meta device (ranks that receive rank 0's weights) it is left empty."""
    old = model.get_output_embeddings()
    head = torch.nn.Linear(old.in_features, 1, bias=True, device=old.weight.device, dtype=old.weight.dtype)
    if head.weight.device.type != "meta":
        text_config = model.config.get_text_config()
        generator = torch.Generator(device=head.weight.device).manual_seed(0)
        with torch.no_grad():
            head.weight.normal_(0.0, getattr(text_config, "initializer_range", 0.02), generator=generator)
            head.bias.zero_()
    model.set_output_embeddings(head)
    for config in {id(c): c for c in (model.config, model.config.get_text_config())}.values():
        config.tie_word_embeddings = False
    if hasattr(model, "all_tied_weights_keys"):  # transformers would tie the new head back to the embeddings
        model.all_tied_weights_keys = {}


def has_value_head(hf_config: Any, lm_head_rows: int) -> bool:
    """A saved image-text-to-text model whose LM head has one output: a critic made by ``use_value_head``."""
    return is_vision_language_config(hf_config) and lm_head_rows == 1


def vision_tower(model: torch.nn.Module) -> torch.nn.Module | None:
    """The image/video encoder of a VLM (``model.visual`` for Qwen-VL), or None for a text model."""
    if hasattr(type(model), "get_base_model"):  # a peft wrapper (models/lora.py): the tower is the wrapped model's
        model = model.get_base_model()
    get_encoder = getattr(model, "get_encoder", None)
    if get_encoder is None:
        return None
    try:
        encoder = get_encoder(modality="image")
    except (TypeError, ValueError):  # remote-code models with the older signature
        return None
    if encoder is model or encoder is getattr(model, "base_model", None):
        return None  # transformers falls back to the model itself when there is no vision encoder
    return encoder


def freeze_vision_tower(model: torch.nn.Module, config_key: str) -> None:
    """Stop gradients into the vision encoder (``worker.actor.model.freeze_vision_tower``)."""
    tower = vision_tower(model)
    if tower is None:
        raise ValueError(
            f"`{config_key}` is true but {type(model).__name__} has no vision tower; set it to false for text models."
        )
    tower.requires_grad_(False)


# ----------------------------------------------------------------------------------------------------------------------
# pixel inputs of a micro-batch
# ----------------------------------------------------------------------------------------------------------------------
# Every FSDP-sharded vision block all-gathers its weights when it runs, a collective: all ranks must run the vision
# tower the same number of times per micro-batch, whatever media their samples hold. So each micro-batch runs it
# exactly ONCE: images and videos go through the tower together (the Qwen-VL models encode both with the same
# function; video pads are renamed image pads, features ordered as their pads appear), and a micro-batch without media
# encodes a one-token blank picture in an extra sequence of its own whose outputs nobody reads.
#
# The dataset stored every picture at the size the processor keeps (easyrl.data.vision.PictureSizing), so the
# processor here only rescales, normalises and cuts patches: the pads the dataset counted and the patches made here
# cannot disagree. Each sample's pads are paired with that sample's own pictures, in the order they appear; pads
# beyond them can only come from the response (a policy may sample a pad token: vLLM reads a sampled token as text),
# and they are read as text here too instead of asking for pictures that do not exist.


@dataclass
class VisionInputs:
    """What a VLM forward of one micro-batch takes beyond the text inputs."""

    input_ids: torch.Tensor
    """(batch, seq) the token ids with every video pad renamed an image pad, and pads sampled in responses renamed
    a text token."""
    pixel_values: torch.Tensor
    """(patches, channels * temporal_patch * patch * patch) of every picture and video, in pad order."""
    image_grid_thw: torch.Tensor
    """(items, 3) the (t, h, w) patch grid of each picture / video, in pad order."""
    blank_tokens: int
    """Tokens of the blank picture to encode in an extra sequence (0: the batch has media of its own)."""
    image_token_id: int
    generated_pads: int = 0
    """Vision pad tokens found beyond the samples' own pictures (sampled by the policy), read as text."""
    items: list[tuple[torch.Tensor, torch.Tensor]] = field(default_factory=list)
    """Per picture / video, in pad order, its (patches, dim) pixels and (3,) grid as processed (host memory; empty
    for the blank picture): the vision tower's cache keys them by content (models/vision_encoder.py)."""


def _row_media(row: Any) -> tuple[list, list]:
    if not row:
        return [], []
    return list(row.get("images") or []), list(row.get("videos") or [])


def _media_lists(rows: Any) -> tuple[list, list]:
    """All images and all videos of the rows, in sample order (rows without media contribute nothing)."""
    images, videos = [], []
    for row in rows if rows is not None else []:
        row_images, row_videos = _row_media(row)
        images.extend(row_images)
        videos.extend(row_videos)
    return images, videos


# (id(processor), kind, id(picture)) -> ((patches, dim) pixels, (3,) grid), dropped when the picture object dies
_PIXEL_CACHE: dict[tuple[int, str, int], tuple[torch.Tensor, torch.Tensor]] = {}


def _remember(key: tuple[int, str, int], item: Any, value: tuple[torch.Tensor, torch.Tensor]) -> None:
    try:
        weakref.finalize(item, _PIXEL_CACHE.pop, key, None)
    except TypeError:  # an object without weak references cannot tell when it dies: do not keep its pixels
        return
    _PIXEL_CACHE[key] = value


def _pixels_once(processor: Any, kind: str, items: list) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per item its (patches, dim) pixels and (3,) grid. Each picture object is processed once for as long as it
    lives: the n samples of a prompt share one object, in this micro-batch and in every later micro-batch, pass and
    epoch of the same call (the call's batch keeps the objects alive)."""
    keys = [(id(processor), kind, id(item)) for item in items]
    missing = {key: item for key, item in zip(keys, items) if key not in _PIXEL_CACHE}
    if missing:
        unique = list(missing.values())
        if kind == "image":
            out = processor.image_processor(images=unique, return_tensors="pt")
            pixels, grids = out["pixel_values"], out["image_grid_thw"]
        else:
            # the dataset sampled the frames already: take every frame, as it did when it counted the video tokens
            out = processor.video_processor(videos=unique, return_tensors="pt", do_sample_frames=False)
            pixels, grids = out["pixel_values_videos"], out["video_grid_thw"]
        patches = torch.split(pixels, [int(grid.prod()) for grid in grids])
        local = {}
        for (key, item), item_patches, grid in zip(missing.items(), patches, grids):
            local[key] = (item_patches, grid)
            _remember(key, item, local[key])
        return [local[key] if key in local else _PIXEL_CACHE[key] for key in keys]
    return [_PIXEL_CACHE[key] for key in keys]


def clear_pixel_cache() -> None:
    """Forget every processed picture (tests; pictures normally leave the cache when their objects die)."""
    _PIXEL_CACHE.clear()


def _blank_picture(processor: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """(merge^2, dim) zero patches and grid (1, merge, merge): one vision token after the spatial merge."""
    image_processor = processor.image_processor
    merge, patch = image_processor.merge_size, image_processor.patch_size
    dim = 3 * image_processor.temporal_patch_size * patch * patch
    return torch.zeros(merge * merge, dim), torch.tensor([1, merge, merge])


def text_token_for_sampled_pads(processor: Any) -> int:
    """The token a vision pad sampled in a response is read as (the pad / eos token): only the positions after it see
    the difference, so a response that ends at such a pad is scored exactly."""
    tokenizer = processor.tokenizer
    for token in (tokenizer.pad_token_id, tokenizer.eos_token_id):
        if token is not None:
            return int(token)
    return 0


def _sampled_pads(pads: torch.Tensor, sample: int, seq_len: int, response_length: int | None) -> torch.Tensor:
    """``pads`` (positions of vision pads left after a sample's own pictures) if all lie in its response; a pad in
    the prompt without its picture means the sample lost media on the way, which must not train silently."""
    if response_length is not None and len(pads) and int(pads[0]) < seq_len - response_length:
        raise ValueError(
            f"Sample {sample} of the micro-batch has {int((pads < seq_len - response_length).sum())} vision pad "
            "token(s) in its prompt beyond the pictures/videos of its `multi_modal_data`: the sample lost media "
            "between the dataset and the actor (a batch concatenated without its multi_modal_data?)."
        )
    return pads


def build_vision_inputs(
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    rows: Any,
    processor: Any,
    response_length: int | None = None,
    response_mask: torch.Tensor | None = None,
) -> VisionInputs:
    """Pixel inputs of exactly these samples (``rows``: their ``multi_modal_data``), ordered as their pad tokens
    appear in the real tokens of ``input_ids`` read row by row (the order the model fills the pads in).

    ``response_length``: the last columns of ``input_ids`` that are responses; pads left over after a sample's own
    pictures must lie there (they were sampled), else the sample's media went missing and this raises. Without it
    every left-over pad is taken as sampled. ``response_mask`` (batch, response_length): 1 on the tokens the policy
    sampled; a pad there is text whatever follows it. A multi-turn response also holds the pads of pictures that tools
    returned (mask 0, their pictures after the prompt's in ``rows``), which a sampled pad before them must not take."""
    images, videos = _media_lists(rows)
    image_token, video_token = processor.image_token_id, processor.video_token_id
    merge = processor.image_processor.merge_size
    if not images and not videos:
        patches, grid = _blank_picture(processor)
        renamed = input_ids.clone()
        is_pad = attention_mask.bool() & ((input_ids == image_token) | (input_ids == video_token))
        for sample in range(input_ids.shape[0]):  # no pictures: every pad must have been sampled
            _sampled_pads(torch.nonzero(is_pad[sample]).flatten(), sample, input_ids.shape[-1], response_length)
        renamed[is_pad] = text_token_for_sampled_pads(processor)
        return VisionInputs(renamed, patches, grid[None], int(grid.prod()) // merge**2, image_token, int(is_pad.sum()))
    processed = {
        "image": iter(_pixels_once(processor, "image", images)) if images else iter(()),
        "video": iter(_pixels_once(processor, "video", videos)) if videos else iter(()),
    }
    renamed = torch.where(input_ids == video_token, image_token, input_ids)
    sampled = torch.zeros_like(attention_mask, dtype=torch.bool)  # (batch, seq) pads the policy sampled
    if response_mask is not None:
        width = response_mask.shape[-1]
        response = input_ids[:, -width:]
        sampled[:, -width:] = response_mask.bool() & ((response == image_token) | (response == video_token))
        renamed[sampled] = text_token_for_sampled_pads(processor)
    patches, grids, generated = [], [], int(sampled.sum())
    for i, row in enumerate(rows):
        row_images, row_videos = _row_media(row)
        queues = {
            "image": [next(processed["image"]) for _ in row_images],
            "video": [next(processed["video"]) for _ in row_videos],
        }
        pads = torch.nonzero(
            attention_mask[i].bool() & ~sampled[i] & ((input_ids[i] == image_token) | (input_ids[i] == video_token))
        ).flatten()
        cursor = 0
        while cursor < len(pads) and (queues["image"] or queues["video"]):
            kind = "video" if int(input_ids[i, pads[cursor]]) == video_token else "image"
            if not queues[kind]:
                break
            item_patches, grid = queues[kind][0]
            tokens = int(grid.prod()) // merge**2
            own = input_ids[i, pads[cursor : cursor + tokens]]
            if len(own) < tokens or not bool((own == (video_token if kind == "video" else image_token)).all()):
                break  # fewer pads than this picture needs: reported below with the pictures left
            queues[kind].pop(0)
            patches.append(item_patches)
            grids.append(grid)
            cursor += tokens
        if queues["image"] or queues["video"]:
            missing = len(queues["image"]) + len(queues["video"])
            raise ValueError(
                f"Sample {i} of the micro-batch has {missing} picture(s)/video(s) without their pad tokens in its "
                "prompt: the prompt was cut (data.max_prompt_length) or encoded by another processor than "
                "worker.actor.model.model_path's. Rebuild the data with the model's processor."
            )
        extra = _sampled_pads(pads[cursor:], i, input_ids.shape[-1], response_length)
        if len(extra):  # sampled by the policy: vLLM read them as text, so does the actor
            renamed[i, extra] = text_token_for_sampled_pads(processor)
            generated += len(extra)
    device = input_ids.device
    return VisionInputs(
        renamed,
        torch.cat(patches).to(device),
        torch.stack(grids).to(device),
        0,
        image_token,
        generated,
        items=list(zip(patches, grids)),
    )


def require_processor(rows: Any, processor: Any) -> None:
    """Rows with media need the model's processor to become pixel inputs."""
    images, videos = _media_lists(rows)
    if (images or videos) and processor is None:
        raise ValueError(
            "The batch has images/videos (`multi_modal_data`) but the model has no multimodal processor; point "
            "worker.actor.model.model_path (or tokenizer_path) at a vision-language checkpoint with its processor."
        )


# ----------------------------------------------------------------------------------------------------------------------
# positions and the blank sequence
# ----------------------------------------------------------------------------------------------------------------------
def packed_mrope_position_ids(packed_positions: torch.Tensor, seqlens: torch.Tensor) -> torch.Tensor:
    """(3, 1, total) packed 3-D rope positions -> (4, 1, total) with a text row first that restarts at 0 for each
    sequence: Qwen-VL text models in transformers 5 read packed sequence boundaries from that row (4-row layout)."""
    seqlens = seqlens.to(packed_positions.device)
    starts = torch.repeat_interleave(torch.cumsum(seqlens, 0) - seqlens, seqlens)  # (total,) start of each token's row
    text_row = torch.arange(packed_positions.shape[-1], device=packed_positions.device) - starts
    return torch.cat([text_row.view(1, 1, -1).to(packed_positions.dtype), packed_positions], dim=0)


def append_blank_sequence(
    input_ids: torch.Tensor, position_ids: torch.Tensor, tokens: int, image_token_id: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Packed (1, total) ids and (4, 1, total) positions plus a sequence of ``tokens`` image pads at the end."""
    ids = torch.full((1, tokens), image_token_id, dtype=input_ids.dtype, device=input_ids.device)
    positions = torch.arange(tokens, dtype=position_ids.dtype, device=position_ids.device)
    positions = positions.view(1, 1, -1).expand(position_ids.shape[0], 1, -1)
    return torch.cat([input_ids, ids], dim=-1), torch.cat([position_ids, positions], dim=-1)


def append_blank_row(
    input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor, tokens: int, image_token_id: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Padded (batch, seq) ids / mask and (3, batch, seq) positions plus a row holding only ``tokens`` image pads
    (right-aligned)."""
    seq = input_ids.shape[-1]
    ids = torch.zeros((1, seq), dtype=input_ids.dtype, device=input_ids.device)
    ids[:, seq - tokens :] = image_token_id
    mask = torch.zeros((1, seq), dtype=attention_mask.dtype, device=attention_mask.device)
    mask[:, seq - tokens :] = 1
    positions = torch.zeros((position_ids.shape[0], 1, seq), dtype=position_ids.dtype, device=position_ids.device)
    positions[..., seq - tokens :] = torch.arange(tokens, dtype=position_ids.dtype, device=position_ids.device)
    return (
        torch.cat([input_ids, ids]),
        torch.cat([attention_mask, mask]),
        torch.cat([position_ids, positions], dim=1),
    )
