"""Image and video rows with a tiny offline Qwen2.5-VL processor: media loading, vision pads, 3-D rope ids."""

import io
import json
import os
import random

import datasets
import numpy as np
import pytest
import torch
from PIL import Image
from transformers import Qwen2VLImageProcessor

from easyrl.config import DataConfig
from easyrl.data.collate import collate_fn
from easyrl.data.dataset import RLHFDataset
from easyrl.data.template import media_in_messages
from easyrl.data.vision import PictureSizing, UnreadableMediaError, load_image, load_video
from easyrl.testing.tiny_vl import tiny_vl_processor
from easyrl.testing.tiny_vlms import tiny_qwen3_vl_processor
from easyrl.testing.user_vl_data import random_size


def picture(width: int, height: int, seed: int = 0) -> Image.Image:
    pixels = np.random.default_rng(seed).integers(0, 255, (height, width, 3), dtype=np.uint8)
    return Image.fromarray(pixels)


def png_bytes(image: Image.Image) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def vl_config(tmp_path, **overrides) -> DataConfig:
    values = {"image_dir": str(tmp_path), "max_prompt_length": 160, "min_pixels": 28 * 28, "max_pixels": 64 * 28 * 28}
    return DataConfig(**{**values, **overrides})


def write_jsonl(path, rows):
    path.write_text("\n".join(json.dumps(row) for row in rows))
    return str(path)


def pad_counts(ids, tokenizer) -> tuple[int, int]:
    ids = torch.as_tensor(ids)
    image_pad, video_pad = tokenizer.convert_tokens_to_ids(["<|image_pad|>", "<|video_pad|>"])
    return int((ids == image_pad).sum()), int((ids == video_pad).sum())


# ----------------------------------------------------------------------------------------------------------------------
# media loading
# ----------------------------------------------------------------------------------------------------------------------
def test_images_load_from_paths_bytes_and_pil(tmp_path):
    image = picture(40, 30)
    image.save(tmp_path / "a.png")
    for source in ("a.png", {"bytes": png_bytes(image), "path": None}, image):
        loaded = load_image(source, str(tmp_path))
        assert loaded.mode == "RGB" and np.array_equal(np.asarray(loaded), np.asarray(image))


def test_images_are_resized_into_the_pixel_range():
    assert load_image(picture(100, 100), max_pixels=2500).size == (50, 50)
    assert load_image(picture(10, 20), min_pixels=800).size == (20, 40)


def test_corrupt_image_raises_a_readable_error(tmp_path):
    (tmp_path / "bad.png").write_bytes(b"not an image")
    with pytest.raises(UnreadableMediaError, match="cannot read image 'bad.png'"):
        load_image("bad.png", str(tmp_path))


def test_video_file_is_sampled_at_video_fps(tmp_path):
    import av

    with av.open(str(tmp_path / "clip.mp4"), "w") as container:
        stream = container.add_stream("mpeg4", rate=4)
        stream.width, stream.height, stream.pix_fmt = 56, 56, "yuv420p"
        for i in range(8):  # 2 seconds at 4 fps
            frame = av.VideoFrame.from_ndarray(np.full((56, 56, 3), i * 30, np.uint8), format="rgb24")
            container.mux(stream.encode(frame))
        container.mux(stream.encode())
    frames, fps = load_video("clip.mp4", str(tmp_path), fps=2.0, min_pixels=784, max_pixels=3136)
    assert frames.shape == (4, 3, 56, 56) and frames.dtype == torch.uint8 and fps == 2.0


# ----------------------------------------------------------------------------------------------------------------------
# dataset rows
# ----------------------------------------------------------------------------------------------------------------------
def test_parquet_rows_with_image_bytes(tmp_path, vl_tokenizer_and_processor):
    tokenizer, processor = vl_tokenizer_and_processor
    rows = [
        {
            "prompt": "How many dots?",
            "answer": str(i),
            "images": [{"bytes": png_bytes(picture(56, 56, i)), "path": None}],
        }
        for i in range(2)
    ]
    datasets.Dataset.from_list(rows).to_parquet(str(tmp_path / "rows.parquet"))
    item = RLHFDataset(str(tmp_path / "rows.parquet"), tokenizer, processor, vl_config(tmp_path))[1]
    assert len(item["multi_modal_data"]["images"]) == 1 and item["ground_truth"] == "1"
    # 56x56 pixels = 4x4 patches of 14 = 2x2 merged tokens; vLLM gets one pad, the model inputs the expanded four
    assert pad_counts(item["input_ids"], tokenizer) == (4, 0)
    assert pad_counts(item["raw_prompt_ids"], tokenizer) == (1, 0)
    assert item["position_ids"].shape == (3, 160)


def test_multi_image_row_follows_the_placeholders(tmp_path, vl_tokenizer_and_processor):
    tokenizer, processor = vl_tokenizer_and_processor
    picture(56, 56).save(tmp_path / "a.png")
    picture(112, 56).save(tmp_path / "b.png")
    path = write_jsonl(
        tmp_path / "d.jsonl",
        [{"prompt": "Is <image> smaller than <image>?", "answer": "yes", "images": ["a.png", "b.png"]}],
    )
    item = RLHFDataset(path, tokenizer, processor, vl_config(tmp_path))[0]
    assert [image.size for image in item["multi_modal_data"]["images"]] == [(56, 56), (112, 56)]
    assert pad_counts(item["input_ids"], tokenizer) == (4 + 8, 0)
    text = tokenizer.decode(item["raw_prompt_ids"])
    assert (
        "Is <|vision_start|><|image_pad|><|vision_end|> smaller than <|vision_start|><|image_pad|><|vision_end|>?"
        in text
    )


def test_video_row_of_frames(tmp_path, vl_tokenizer_and_processor):
    tokenizer, processor = vl_tokenizer_and_processor
    for i in range(4):
        picture(56, 56, i).save(tmp_path / f"f{i}.png")
    path = write_jsonl(
        tmp_path / "d.jsonl", [{"prompt": "What moves?", "answer": "x", "videos": [[f"f{i}.png" for i in range(4)]]}]
    )
    item = RLHFDataset(path, tokenizer, processor, vl_config(tmp_path))[0]
    (frames,) = item["multi_modal_data"]["videos"]
    assert frames.shape == (4, 3, 56, 56)
    # 4 frames / temporal patch 2 = 2 steps x 2x2 merged tokens
    assert pad_counts(item["input_ids"], tokenizer) == (0, 8)
    assert pad_counts(item["raw_prompt_ids"], tokenizer) == (0, 1)
    # temporal rope ids of the two steps are tokens_per_second * (temporal_patch / fps) = 2 apart
    video = item["input_ids"] == tokenizer.convert_tokens_to_ids("<|video_pad|>")
    assert item["position_ids"][0, video].unique().diff().tolist() == [2]


def test_a_video_named_inside_a_message_is_read_like_one_in_the_video_column(tmp_path, vl_tokenizer_and_processor):
    tokenizer, processor = vl_tokenizer_and_processor
    for i in range(4):
        picture(56, 56, i).save(tmp_path / f"f{i}.png")
    frames = [f"f{i}.png" for i in range(4)]
    column = {"prompt": "What moves?", "answer": "x", "videos": [frames]}
    part = {"type": "video", "video": frames}
    named = {"prompt": [{"role": "user", "content": [part, {"type": "text", "text": "What moves?"}]}], "answer": "x"}
    items = [
        RLHFDataset(write_jsonl(tmp_path / f"{name}.jsonl", [row]), tokenizer, processor, vl_config(tmp_path))[0]
        for name, row in (("column", column), ("named", named))
    ]
    assert torch.equal(items[0]["multi_modal_data"]["videos"][0], items[1]["multi_modal_data"]["videos"][0])
    assert torch.equal(items[0]["input_ids"], items[1]["input_ids"])
    assert pad_counts(items[1]["input_ids"], tokenizer) == (0, 8)


def test_a_row_with_more_pictures_than_the_engine_takes_is_skipped_and_named(tmp_path, vl_tokenizer_and_processor):
    """worker.rollout.limit_images: vLLM would refuse such a prompt at step 1 and end the run."""
    tokenizer, processor = vl_tokenizer_and_processor
    picture(56, 56).save(tmp_path / "a.png")
    rows = [
        {"prompt": "<image> and <image>?", "answer": "0", "images": ["a.png", "a.png"]},
        {"prompt": "<image>?", "answer": "1", "images": ["a.png"]},
    ]
    path = write_jsonl(tmp_path / "d.jsonl", rows)
    dataset = RLHFDataset(path, tokenizer, processor, vl_config(tmp_path), max_images=1)
    assert len(dataset) == 1 and dataset[0]["ground_truth"] == "1"
    assert dataset.unreadable_rows == [
        (0, "it has 2 pictures and worker.rollout.limit_images is 1 (the rollout engine refuses more in one prompt); "
         "raise it")
    ]  # fmt: skip
    assert len(RLHFDataset(path, tokenizer, processor, vl_config(tmp_path), max_images=2)) == 2


def test_a_picture_column_the_image_key_misses_is_named_before_training_text_only(
    tmp_path, vl_tokenizer_and_processor
):
    """Many Hugging Face datasets call the column `image`; EasyR1's default key is `images`."""
    tokenizer, processor = vl_tokenizer_and_processor
    picture(56, 56).save(tmp_path / "a.png")
    path = write_jsonl(tmp_path / "d.jsonl", [{"prompt": "How many?", "answer": "1", "image": "a.png"}])
    with pytest.raises(KeyError, match=r"no column 'images' \(data.image_key\) but a column 'image': without "
                       r"data.image_key=image the model would see none of its images"):  # fmt: skip
        RLHFDataset(path, tokenizer, processor, vl_config(tmp_path))
    item = RLHFDataset(path, tokenizer, processor, vl_config(tmp_path, image_key="image"))[0]
    assert len(item["multi_modal_data"]["images"]) == 1
    # SFT reads the same keys: a conversation with its picture under `image` is refused too (it trained text-only)
    from easyrl.config.schema import SFTConfig
    from easyrl.data.sft import SFTDataset

    chat = [{"role": "user", "content": "How many?"}, {"role": "assistant", "content": "1"}]
    conversations = write_jsonl(tmp_path / "c.jsonl", [{"messages": chat, "image": "a.png"}])
    with pytest.raises(KeyError, match=r"no column 'images' \(data.image_key\) but a column 'image'"):
        SFTDataset(conversations, tokenizer, processor, vl_config(tmp_path), SFTConfig(max_length=200))
    sft_item = SFTDataset(
        conversations, tokenizer, processor, vl_config(tmp_path, image_key="image"), SFTConfig(max_length=200)
    )[0]
    assert len(sft_item["multi_modal_data"]["images"]) == 1
    # a column of any name whose values name picture files (the first non-empty of the first rows), with or without
    # placeholders, in RL and SFT data: the rows without placeholders trained on their text alone
    for name, value in (("pics", ["a.png"]), ("figure", {"bytes": None, "path": "x/A.JPG"}), ("shot", "a.png")):
        rows = [
            {"prompt": "How many?", "answer": "0", name: None},
            {"prompt": "How many?", "answer": "1", name: value},
        ]
        with pytest.raises(KeyError, match=rf"no column 'images' \(data.image_key\) but a column '{name}': without "):
            RLHFDataset(write_jsonl(tmp_path / f"{name}.jsonl", rows), tokenizer, processor, vl_config(tmp_path))
    with pytest.raises(KeyError, match=r"no column 'videos' \(data.video_key\) but a column 'clip'"):
        clips = [{"messages": chat, "clip": "https://example.com/v.mp4?x=1"}]
        SFTDataset(write_jsonl(tmp_path / "v.jsonl", clips), tokenizer, processor, vl_config(tmp_path), SFTConfig())
    # placeholders with the pictures under a name no check can tell: the rows go, and the error says where to look
    placed = write_jsonl(tmp_path / "p.jsonl", [{"prompt": "<image>How many?", "answer": "1", "ref": "img-1"}])
    with pytest.raises(ValueError, match=r"but the row has no images or videos\); check data.image_key / "
                       r"data.video_key \(the columns are \['prompt', 'answer', 'ref'\]\)"):  # fmt: skip
        RLHFDataset(placed, tokenizer, processor, vl_config(tmp_path))
    # an answer that names a file is the answer's
    answered = [{"prompt": "Which file?", "answer": "a.png"}]
    assert (
        len(RLHFDataset(write_jsonl(tmp_path / "n.jsonl", answered), tokenizer, processor, vl_config(tmp_path))) == 1
    )


def test_corrupt_image_row_is_skipped_counted_and_reported(tmp_path, vl_tokenizer_and_processor, caplog):
    tokenizer, processor = vl_tokenizer_and_processor
    picture(56, 56).save(tmp_path / "ok.png")
    (tmp_path / "broken.png").write_bytes(png_bytes(picture(56, 56))[:40])  # truncated file
    rows = [
        {"prompt": "a", "answer": "0", "images": ["ok.png"]},
        {"prompt": "b", "answer": "1", "images": ["broken.png"]},
    ]
    dataset = RLHFDataset(write_jsonl(tmp_path / "d.jsonl", rows), tokenizer, processor, vl_config(tmp_path))
    assert len(dataset) == 1 and dataset.num_unreadable == 1
    assert dataset.unreadable_rows[0][0] == 1 and "broken.png" in dataset.unreadable_rows[0][1]
    assert (
        "skipped 1 of 2 rows whose pictures/videos or prompts cannot be used (row 1: cannot read image 'broken.png'"
        in caplog.text
    )


def test_overlong_count_includes_vision_tokens(tmp_path, vl_tokenizer_and_processor):
    tokenizer, processor = vl_tokenizer_and_processor
    picture(56, 56).save(tmp_path / "small.png")
    picture(112, 112).save(tmp_path / "big.png")  # 16 vision tokens (the small one has 4)
    rows = [
        {"prompt": "x", "answer": "0", "images": ["small.png"]},
        {"prompt": "x", "answer": "1", "images": ["big.png"]},
    ]
    config = vl_config(tmp_path, max_prompt_length=32, filter_overlong_prompts=True)
    dataset = RLHFDataset(write_jsonl(tmp_path / "d.jsonl", rows), tokenizer, processor, config)
    assert len(dataset) == 1 and dataset.num_filtered_overlong == 1 and dataset[0]["ground_truth"] == "0"


def test_position_ids_equal_the_models_own_in_a_padded_mixed_batch(
    tmp_path, tiny_vl_model_path, vl_tokenizer_and_processor
):
    from transformers import Qwen2_5_VLForConditionalGeneration

    tokenizer, processor = vl_tokenizer_and_processor
    picture(56, 84).save(tmp_path / "a.png")
    picture(112, 56).save(tmp_path / "b.png")
    for i in range(4):
        picture(56, 56, i).save(tmp_path / f"f{i}.png")
    rows = [
        {"prompt": "One <image> here.", "answer": "0", "images": ["a.png"], "videos": []},
        {"prompt": "Just text.", "answer": "1", "images": [], "videos": []},
        {"prompt": "<image> then <image>", "answer": "2", "images": ["b.png", "a.png"], "videos": []},
        {"prompt": "A clip", "answer": "3", "images": [], "videos": [[f"f{i}.png" for i in range(4)]]},
    ]
    dataset = RLHFDataset(write_jsonl(tmp_path / "d.jsonl", rows), tokenizer, processor, vl_config(tmp_path))
    batch = collate_fn([dataset[i] for i in range(len(dataset))])
    assert batch.non_tensor_batch["multi_modal_data"][1] is None  # text rows mix with image rows

    # the model's own inputs for the same batch: processor outputs of each row, token types left-padded
    encoded = [dataset.encoder.encode(dataset.rows[i], i)["model_inputs"] for i in range(len(dataset))]
    length = batch.batch["input_ids"].shape[-1]
    token_types = torch.stack(
        [
            torch.nn.functional.pad(
                e.get("mm_token_type_ids", torch.zeros_like(e["input_ids"]))[0], (length - e["input_ids"].shape[-1], 0)
            )
            for e in encoded
        ]
    )
    inputs = {
        "input_ids": batch.batch["input_ids"],
        "attention_mask": batch.batch["attention_mask"],
        "mm_token_type_ids": token_types,
        "pixel_values": torch.cat([e["pixel_values"] for e in encoded if "pixel_values" in e]),
        "image_grid_thw": torch.cat([e["image_grid_thw"] for e in encoded if "image_grid_thw" in e]),
        "pixel_values_videos": torch.cat([e["pixel_values_videos"] for e in encoded if "pixel_values_videos" in e]),
        "video_grid_thw": torch.cat([e["video_grid_thw"] for e in encoded if "video_grid_thw" in e]),
        "second_per_grid_ts": torch.tensor([t for e in encoded for t in e.get("second_per_grid_ts", [])]),
    }
    model = Qwen2_5_VLForConditionalGeneration.from_pretrained(tiny_vl_model_path).eval()
    with torch.no_grad():
        internal = model(**inputs).logits
        ours = model(**inputs, position_ids=batch.batch["position_ids"].transpose(0, 1)).logits  # (3, batch, seq)
    valid = batch.batch["attention_mask"].bool()
    without_video = [0, 1, 2]
    assert torch.equal(internal[without_video][valid[without_video]], ours[without_video][valid[without_video]])
    # the video row follows vLLM and the released Qwen code where transformers 5.19 differs: the text after the video
    # starts one past the video's largest position on any axis (here the time axis)
    ids, positions = batch.batch["input_ids"][3], batch.batch["position_ids"][3]  # (seq,), (3, seq)
    after_video = int(torch.nonzero(ids == processor.video_token_id).max()) + 1
    largest = int(positions[:, :after_video].max())
    assert positions[:, after_video].tolist() == [largest + 1] * 3
    assert largest > int(positions[1:, :after_video].max())  # time spans more positions than space here
    # and the ids really are 3-D: the image rows' vision tokens differ across the (t, h, w) rows
    assert not torch.equal(batch.batch["position_ids"][0, 1], batch.batch["position_ids"][0, 2])


def test_text_after_a_vision_block_starts_one_past_its_largest_position():
    from easyrl.data.rope import continue_after_largest

    # text 0-2, a video block starting at 3 spanning 4 time steps (t 3..6) and 2 x 2 space, then two text tokens that
    # transformers 5.19 would start at 3 + 2 = 5; the released Qwen rule (and vLLM) starts them at 6 + 1 = 7
    t = [0, 1, 2, 3, 3, 4, 4, 5, 5, 6, 6, 5, 6]
    h = [0, 1, 2, 3, 4, 3, 4, 3, 4, 3, 4, 5, 6]
    w = [0, 1, 2, 3, 3, 3, 3, 3, 3, 3, 3, 5, 6]
    vision = torch.tensor([0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0]).bool()
    out = continue_after_largest(torch.tensor([t, h, w]), vision)
    assert out[:, :11].tolist() == [t[:11], h[:11], w[:11]]  # text and the block itself unchanged
    assert out[:, 11:].tolist() == [[7, 8]] * 3


# ----------------------------------------------------------------------------------------------------------------------
# the one sizing rule: every picture is stored at the size every processor call keeps
# ----------------------------------------------------------------------------------------------------------------------
def issue_image_processor(min_pixels: int = 56 * 56, max_pixels: int = 224 * 224):
    """A Qwen2.5-VL image processor with patch 14, merge 2 and the given limits (the issue's: 56x56 to 224x224)."""
    size = {"shortest_edge": min_pixels, "longest_edge": max_pixels}
    return Qwen2VLImageProcessor(size=size, patch_size=14, merge_size=2, temporal_patch_size=2)


def test_effective_limits_are_the_data_limits_clamped_into_the_processors_range(caplog):
    from easyrl.data.vision import _warn_clamped

    _warn_clamped.cache_clear()  # said once per process and value: another test may have said it already
    processor = issue_image_processor()  # [3136, 50176]
    with caplog.at_level("WARNING"):
        inside = PictureSizing.from_processor(processor, 4000, 20000)
    assert (inside.factor, inside.min_pixels, inside.max_pixels) == (28, 4000, 20000)
    assert not caplog.text
    # EasyR1's defaults lie above this processor's range: its maximum wins on both ends, as it would in EasyR1
    # (dataset upscale to >= 262144 pixels, then the processor's downscale to <= 50176); the log says so
    with caplog.at_level("WARNING"):
        easyr1 = PictureSizing.from_processor(processor, 262144, 4194304)
    assert (easyr1.min_pixels, easyr1.max_pixels) == (50176, 50176)
    assert "data.min_pixels=262144 is outside the model processor's range [3136, 50176]" in caplog.text
    assert "data.max_pixels=4194304 is outside" in caplog.text and "sized with 50176" in caplog.text
    unset = PictureSizing.from_processor(processor, None, None)
    assert (unset.min_pixels, unset.max_pixels) == (3136, 50176)
    below = PictureSizing.from_processor(processor, 100, 1000)
    assert (below.min_pixels, below.max_pixels) == (3136, 3136)
    with pytest.raises(ValueError, match=r"data.min_pixels \(9000\) is larger than data.max_pixels \(8000\)"):
        PictureSizing.from_processor(processor, 9000, 8000)


@pytest.mark.parametrize(
    ("size", "stored"),
    [
        ((112, 112), (112, 112)),  # already multiples of 28 inside the range: untouched
        ((16, 16), (56, 56)),  # 28x28 < 3136: scale by sqrt(3136 / 256) = 3.5, ceil(56 / 28) = 2 -> 56
        ((4000, 3000), (252, 168)),  # beta = sqrt(12e6 / 50176) = 15.46: floor(258.6 / 28) = 9, floor(194.0 / 28) = 6
        ((1000, 125), (616, 56)),  # 8:1, beta = 1.578: floor(633.5 / 28) = 22 -> 616, floor(79.2 / 28) = 2 -> 56
        ((16, 128), (28, 140)),  # 1:8, round(16 / 28) = 1, round(128 / 28) = 5: 28 x 140 = 3920 >= 3136
        ((200, 100), (196, 112)),  # round(200 / 28) = 7, round(100 / 28) = 4: 196 x 112 = 21952 in range
    ],
)
def test_pictures_are_stored_at_the_processors_own_size(size, stored):
    sizing = PictureSizing.from_processor(issue_image_processor(), 3136, 50176)
    assert sizing.target_size(*size) == stored
    assert sizing(picture(*size)).size == stored


def test_a_picture_beyond_the_processors_aspect_ratio_is_unusable():
    sizing = PictureSizing.from_processor(issue_image_processor(), 3136, 50176)
    with pytest.raises(UnreadableMediaError, match="3000x10 picture cannot be sized.*aspect ratio"):
        sizing.target_size(3000, 10)


@pytest.mark.parametrize("family", ["qwen2_5_vl", "qwen3_vl"])
@pytest.mark.parametrize("limits", [(None, None), (262144, 4194304), (1000, 5000), (3000, 3000)])
def test_every_processor_call_keeps_the_stored_picture_as_it_is(family, limits):
    """Random sizes from 16 px to 4k, ratios up to 1:8: the processor's own resize of the stored picture is a no-op
    (same grid as the stored size, same pixels as with resizing off), so the dataset, the actor and vLLM agree."""
    image_processor = (tiny_vl_processor() if family == "qwen2_5_vl" else tiny_qwen3_vl_processor()).image_processor
    sizing = PictureSizing.from_processor(image_processor, *limits)
    rng = random.Random(str(limits))
    sizes = [random_size(rng) for _ in range(40)] + [(16, 16), (4096, 4096), (16, 128), (4096, 512), (21, 4096)]
    for width, height in sizes:
        stored = sizing.target_size(width, height)
        assert stored[0] % sizing.factor == 0 and stored[1] % sizing.factor == 0
        image = picture(*stored, seed=width)
        out = image_processor(images=[image], return_tensors="pt")
        patch = image_processor.patch_size
        assert out["image_grid_thw"].tolist() == [[1, stored[1] // patch, stored[0] // patch]], (width, height)
        unresized = image_processor(images=[image], return_tensors="pt", do_resize=False)
        assert torch.equal(out["pixel_values"], unresized["pixel_values"]), (width, height)


# ----------------------------------------------------------------------------------------------------------------------
# any PIL mode, any container
# ----------------------------------------------------------------------------------------------------------------------
def saved(image: Image.Image, file_format: str, **kwargs) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format=file_format, **kwargs)
    return buffer.getvalue()


def test_transparent_pixels_become_white_and_opaque_ones_keep_their_colour():
    rgba = Image.new("RGBA", (3, 1))
    rgba.putdata([(10, 20, 30, 0), (10, 20, 30, 255), (10, 20, 30, 128)])
    loaded = np.asarray(load_image({"bytes": saved(rgba, "PNG"), "path": None}))
    assert loaded[0, 0].tolist() == [255, 255, 255] and loaded[0, 1].tolist() == [10, 20, 30]
    # half transparent over white: 10 * 128/255 + 255 * 127/255 = 132.0 (and 137.0, 142.0)
    assert np.abs(loaded[0, 2].astype(int) - [132, 137, 142]).max() <= 1


def test_an_animated_picture_is_read_as_its_first_frame_and_said_once(tmp_path, caplog):
    frames = [Image.new("RGB", (2, 1), colour) for colour in ((200, 0, 0), (0, 200, 0), (0, 0, 200))]
    path = tmp_path / "spin.gif"
    frames[0].save(path, save_all=True, append_images=frames[1:], duration=100, loop=0)
    with caplog.at_level("WARNING"):
        first = np.asarray(load_image(str(path)))
        load_image(str(path))  # read again (the row drawn again): said once
    assert first[0, 0].tolist() == [200, 0, 0]
    warnings = [record.getMessage() for record in caplog.records if "animated" in record.getMessage()]
    assert warnings == [
        f"image {str(path)!r} is animated (3 frames): only its first frame is used, as the processor reads it; give "
        "its frames as a video (data.video_key) for the model to see them all."
    ]
    caplog.clear()
    with caplog.at_level("WARNING"):
        load_image(saved(frames[0], "GIF"))  # a one-frame GIF is a plain picture
    assert "animated" not in caplog.text


def test_palette_greyscale_bilevel_and_16_bit_pictures_become_rgb():
    palette = Image.new("P", (2, 1))
    palette.putpalette([0, 0, 0, 200, 10, 10] + [0] * 762)
    palette.putdata([0, 1])
    assert np.asarray(load_image(saved(palette, "PNG", transparency=0))).tolist() == [[[255] * 3, [200, 10, 10]]]
    assert np.asarray(load_image(saved(palette, "GIF"))).tolist() == [[[0] * 3, [200, 10, 10]]]
    grey = Image.new("LA", (1, 1), (77, 255))
    assert np.asarray(load_image(saved(grey, "PNG"))).tolist() == [[[77] * 3]]
    bilevel = Image.new("1", (2, 1))
    bilevel.putdata([0, 1])
    assert np.asarray(load_image(saved(bilevel, "PNG"))).tolist() == [[[0] * 3, [255] * 3]]
    # 16-bit greyscale is scaled, not clipped: 65535 -> 255, 25700 (= 100 x 257) -> 100
    deep = Image.new("I;16", (2, 1))
    deep.putdata([65535, 25700])
    assert np.asarray(load_image(saved(deep, "PNG"))).tolist() == [[[255] * 3, [100] * 3]]


def test_cmyk_jpeg_and_exif_rotated_jpeg_load_as_a_viewer_shows_them():
    red = Image.new("CMYK", (16, 16), (0, 255, 255, 0))
    loaded = np.asarray(load_image(saved(red, "JPEG", quality=95)))
    assert np.abs(loaded.astype(int) - [255, 0, 0]).max() <= 8  # JPEG's rounding of a flat colour
    # stored 32 wide x 16 high, with a dark left half, and "rotate 90 degrees clockwise to view" (orientation 6)
    sideways = Image.new("RGB", (32, 16), (250, 250, 250))
    sideways.paste((0, 0, 0), (0, 0, 16, 16))
    exif = Image.Exif()
    exif[0x0112] = 6
    upright = load_image(saved(sideways, "JPEG", exif=exif, quality=95))
    assert upright.size == (16, 32)
    pixels = np.asarray(upright).mean(-1)
    assert pixels[:16].mean() < 20 and pixels[16:].mean() > 230  # the dark half is now on top


def test_a_picture_too_large_for_pil_is_unreadable_not_a_crash(monkeypatch):
    # PIL refuses pictures above 2 x MAX_IMAGE_PIXELS (a decompression bomb); here 100 x 100 against a 1000 limit
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1000)
    with pytest.raises(UnreadableMediaError, match="cannot read image bytes"):
        load_image(saved(picture(100, 100), "PNG"))


def test_an_undecodable_stored_picture_is_named_by_the_path_its_row_keeps():
    """A Hugging Face Image feature's {"bytes", "path"} (EasyR1's geo3k parquet) read "image dict" and PIL's repr of an
    in-memory file, <_io.BytesIO object at 0x...>, which names nothing the user has."""
    with pytest.raises(UnreadableMediaError) as error:
        load_image({"bytes": b"notapng", "path": "geo/12.png"})
    assert str(error.value) == "cannot read image 'geo/12.png' (7 bytes in the row): cannot identify image file"
    with pytest.raises(UnreadableMediaError, match=r"^cannot read image \(7 bytes in the row\): cannot identify"):
        load_image({"bytes": b"notapng", "path": None})


def test_relative_paths_resolve_against_image_dir_then_the_data_files_folder(tmp_path, vl_tokenizer_and_processor):
    tokenizer, processor = vl_tokenizer_and_processor
    data_dir, image_dir = tmp_path / "data", tmp_path / "pictures"
    (data_dir / "img").mkdir(parents=True)
    image_dir.mkdir()
    picture(56, 56, 1).save(data_dir / "img" / "next_to_data.png")
    picture(56, 56, 2).save(image_dir / "in_image_dir.png")
    rows = [
        {"prompt": "a", "answer": "0", "images": ["img/next_to_data.png"]},
        {"prompt": "b", "answer": "1", "images": [{"path": "in_image_dir.png", "bytes": None}]},
        {"prompt": "c", "answer": "2", "images": ["missing.png"]},
        {"prompt": "d", "answer": "3", "images": [""]},
        {"prompt": "e", "answer": "4", "images": ["img"]},
    ]
    path = write_jsonl(data_dir / "d.jsonl", rows)
    dataset = RLHFDataset(path, tokenizer, processor, vl_config(image_dir))
    assert len(dataset) == 2 and [row for row, _ in dataset.unusable_rows] == [2, 3, 4]
    reasons = [reason for _, reason in dataset.unusable_rows]
    # every place it was looked for, in order: data.image_dir, the data file's folder, the working directory
    tried = f"{image_dir / 'missing.png'}, {data_dir / 'missing.png'}, {os.path.abspath('missing.png')}"
    assert reasons[0] == f"cannot read image 'missing.png': no such file (tried {tried})"
    assert reasons[1] == "cannot read image '': the path is empty"
    assert reasons[2] == (
        f"cannot read image 'img': {data_dir / 'img'} is a folder; name a file (a video's frames: a list of picture "
        "files)"
    )
    for item, seed in zip((dataset[0], dataset[1]), (1, 2)):
        assert np.array_equal(np.asarray(item["multi_modal_data"]["images"][0]), np.asarray(picture(56, 56, seed)))


# ----------------------------------------------------------------------------------------------------------------------
# prompts and their pictures
# ----------------------------------------------------------------------------------------------------------------------
def test_pictures_without_placeholders_go_before_the_text(tmp_path, vl_tokenizer_and_processor):
    # EasyR1 splits the text on <image> only: a row without the placeholder reaches the processor with pictures but
    # no pad, which fails there; easyrl puts the pictures first, in order
    tokenizer, processor = vl_tokenizer_and_processor
    picture(56, 56).save(tmp_path / "a.png")
    picture(112, 56).save(tmp_path / "b.png")
    rows = [{"prompt": "Which is wider?", "answer": "b", "images": ["a.png", "b.png"]}]
    item = RLHFDataset(write_jsonl(tmp_path / "d.jsonl", rows), tokenizer, processor, vl_config(tmp_path))[0]
    pair = "<|vision_start|><|image_pad|><|vision_end|>" * 2
    assert f"<|im_start|>user\n{pair}Which is wider?<|im_end|>" in tokenizer.decode(item["raw_prompt_ids"])
    assert pad_counts(item["input_ids"], tokenizer) == (4 + 8, 0)


def test_pictures_load_from_data_uris_and_urls_and_a_bad_one_is_named_briefly(tmp_path):
    import base64
    import functools
    import http.server
    import threading

    image = picture(40, 30)
    uri = "data:image/png;base64," + base64.b64encode(png_bytes(image)).decode()
    image.save(tmp_path / "a.png")
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(tmp_path))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/a.png"
        for source in (uri, url):
            assert np.array_equal(np.asarray(load_image(source)), np.asarray(image))
        with pytest.raises(UnreadableMediaError, match=r"cannot download .*/missing\.png': HTTP 404"):
            load_image(url.replace("a.png", "missing.png"))
    finally:
        server.shutdown()
    broken = uri[:-40] + "!!!!" + uri[-36:]
    with pytest.raises(UnreadableMediaError, match=r"base64 is malformed") as error:
        load_image(broken)
    assert len(str(error.value)) < 300  # the picture is named by its start and size, not a screenful of base64


def test_chat_messages_that_carry_their_own_pictures(tmp_path, vl_tokenizer_and_processor):
    """Qwen's own format ({"type": "image", "image": path}), transformers' ({"type": "image", "url": ...}) and
    OpenAI's ({"type": "image_url", "image_url": {"url": "data:..."}}): the pictures are read from the parts, in
    order, and the chat template gets bare image parts."""
    import base64

    tokenizer, processor = vl_tokenizer_and_processor
    picture(56, 56).save(tmp_path / "a.png")
    uri = "data:image/png;base64," + base64.b64encode(png_bytes(picture(112, 56))).decode()

    def row(parts, images=None):
        return {"prompt": [{"role": "user", "content": parts}], "answer": "1", "images": images}

    text = {"type": "text", "text": "How many?"}
    rows = [
        row([{"type": "image", "image": str(tmp_path / "a.png")}, text]),
        row(
            [
                {"type": "image", "url": f"file://{tmp_path / 'a.png'}"},
                text,
                {"type": "image_url", "image_url": {"url": uri}},
            ]
        ),
        row([text, {"type": "image_url", "image_url": {"url": uri}}]),
        row([{"type": "image", "image": "a.png"}, text], images=["a.png"]),  # both: which pictures? skipped
        row([text]),
    ]
    datasets.Dataset.from_list(rows).to_parquet(str(tmp_path / "m.parquet"))  # parts with every key, None if unused
    dataset = RLHFDataset(str(tmp_path / "m.parquet"), tokenizer, processor, vl_config(tmp_path))
    assert [index for index, _ in dataset.unusable_rows] == [3]
    assert "name their own pictures/videos and the row also has some" in dataset.unusable_rows[0][1]
    sizes = [[im.size for im in (dataset[i]["multi_modal_data"] or {}).get("images", [])] for i in range(4)]
    assert sizes == [[(56, 56)], [(56, 56), (112, 56)], [(112, 56)], []]
    assert [pad_counts(dataset[i]["input_ids"], tokenizer)[0] for i in range(4)] == [4, 12, 8, 0]
    block = "<|vision_start|><|image_pad|><|vision_end|>"
    assert f"How many?{block}<|im_end|>" in tokenizer.decode(dataset[2]["raw_prompt_ids"])
    # OpenAI also allows the URL as a plain string
    assert media_in_messages([{"role": "user", "content": [{"type": "image_url", "image_url": uri}]}]) == ([uri], [])


def test_pictures_in_messages_held_as_json_text_or_in_a_single_message_load_as_in_a_list(
    tmp_path, vl_tokenizer_and_processor
):
    """Messages read from JSON text (a CSV cell) or a lone message dict carry their pictures the way a list of them
    does: the same pictures, pads and prompt."""
    import csv

    tokenizer, processor = vl_tokenizer_and_processor
    picture(56, 56).save(tmp_path / "a.png")
    message = {"role": "user", "content": [{"type": "image", "image": "a.png"}, {"type": "text", "text": "How many?"}]}
    as_list = write_jsonl(tmp_path / "list.jsonl", [{"prompt": [message], "answer": "1"}])
    one = write_jsonl(tmp_path / "one.jsonl", [{"prompt": message, "answer": "1"}])
    with (tmp_path / "text.csv").open("w", newline="") as handle:
        csv.writer(handle).writerows([["prompt", "answer"], [json.dumps([message]), "1"]])
    items = [
        RLHFDataset(path, tokenizer, processor, vl_config(tmp_path))[0]
        for path in (as_list, one, str(tmp_path / "text.csv"))
    ]
    for item in items:
        assert [image.size for image in item["multi_modal_data"]["images"]] == [(56, 56)]
        assert pad_counts(item["input_ids"], tokenizer) == (4, 0)
        assert item["raw_prompt_ids"] == items[0]["raw_prompt_ids"] and item["conversational"] is True


def test_an_empty_picture_text_is_no_picture_and_a_json_list_in_a_cell_is_that_list(
    tmp_path, vl_tokenizer_and_processor
):
    """`"images": ""` in a jsonl (a frame's empty cell written out) was read as one picture with an empty path and
    skipped the row, though an empty CSV cell was none; a JSON list in a CSV cell was read as one path."""
    import csv

    tokenizer, processor = vl_tokenizer_and_processor
    picture(56, 56).save(tmp_path / "a.png")
    rows = [
        {"prompt": "a text row", "answer": "0", "images": ""},
        {"prompt": "<image><image> two", "answer": "1", "images": json.dumps(["a.png", "a.png"])},
        {"prompt": "<image> one", "answer": "2", "images": "a.png"},
        {"prompt": "also text", "answer": "3", "images": "  "},
    ]
    with (tmp_path / "rows.csv").open("w", newline="") as handle:
        csv.writer(handle).writerows([["prompt", "answer", "images"], *[list(row.values()) for row in rows]])
    for path in (write_jsonl(tmp_path / "rows.jsonl", rows), str(tmp_path / "rows.csv")):
        dataset = RLHFDataset(path, tokenizer, processor, vl_config(tmp_path))
        assert dataset.unusable_rows == [], path
        counts = [len((dataset[i]["multi_modal_data"] or {}).get("images", [])) for i in range(4)]
        assert counts == [0, 2, 1, 0], path
        assert [pad_counts(dataset[i]["input_ids"], tokenizer)[0] for i in range(4)] == [0, 8, 4, 0], path


def test_rows_whose_text_does_not_match_their_pictures_are_skipped_and_named(
    tmp_path, vl_tokenizer_and_processor, caplog
):
    tokenizer, processor = vl_tokenizer_and_processor
    picture(56, 56).save(tmp_path / "a.png")
    rows = [
        {"prompt": "<image> fine", "answer": "0", "images": ["a.png"]},
        {"prompt": "one <image> for two", "answer": "1", "images": ["a.png", "a.png"]},
        {"prompt": "text that spells <|image_pad|> out", "answer": "2", "images": []},
        {"prompt": "<image> names a picture it lacks", "answer": "3", "images": []},  # was trained as the text
        {"prompt": "a text row", "answer": "4", "images": []},
    ]
    dataset = RLHFDataset(write_jsonl(tmp_path / "d.jsonl", rows), tokenizer, processor, vl_config(tmp_path))
    assert len(dataset) == 2 and [row for row, _ in dataset.unusable_rows] == [1, 2, 3]
    assert "1 <image> and 0 <video> placeholders but the row has 2 images" in dataset.unusable_rows[0][1]
    assert "1 image pad tokens where its images need 0" in dataset.unusable_rows[1][1]
    assert "the prompt has 1 <image> / <video> placeholder but the row has no images" in dataset.unusable_rows[2][1]
    assert "skipped 3 of 5 rows" in caplog.text
    # a data.format_prompt that writes <image> itself: the reason says the markers are the template's (the rows'
    # own text has none, and the reason blamed "the prompt")
    template = tmp_path / "marker.jinja"
    template.write_text("<image>{{ content }} Answer briefly.")
    config = vl_config(tmp_path, format_prompt=str(template))
    rows = [
        {"prompt": "How many?", "answer": "0", "images": ["a.png"]},  # the template's marker is its picture's
        {"prompt": "<image> and", "answer": "1", "images": ["a.png"]},
        {"prompt": "a text row", "answer": "2", "images": []},
    ]
    dataset = RLHFDataset(write_jsonl(tmp_path / "e.jsonl", rows), tokenizer, processor, config)
    assert len(dataset) == 1 and [row for row, _ in dataset.unusable_rows] == [1, 2]
    note = f" (1 of them written into every prompt by data.format_prompt {template})"
    assert dataset.unusable_rows[0][1] == (
        "the text has 2 <image> and 0 <video> placeholders but the row has 1 images and 0 videos" + note
    )
    assert dataset.unusable_rows[1][1] == (
        "the prompt has 1 <image> / <video> placeholder but the row has no images or videos" + note
    )


def test_without_filtering_a_prompt_is_cut_after_its_pictures_never_inside_them(
    tmp_path, vl_tokenizer_and_processor, caplog
):
    tokenizer, processor = vl_tokenizer_and_processor
    picture(112, 112).save(tmp_path / "big.png")  # 16 vision tokens
    rows = [
        {"prompt": "<image>" + " word" * 60, "answer": "0", "images": ["big.png"]},  # cut in the text after it
        {"prompt": " word" * 60 + "<image>", "answer": "1", "images": ["big.png"]},  # the cut would hit the picture
    ]
    config = vl_config(tmp_path, max_prompt_length=48, filter_overlong_prompts=False)
    dataset = RLHFDataset(write_jsonl(tmp_path / "d.jsonl", rows), tokenizer, processor, config)
    assert len(dataset) == 1 and dataset.num_truncated == 1 and [row for row, _ in dataset.unusable_rows] == [1]
    assert "would cut into its pictures/videos" in dataset.unusable_rows[0][1]
    full = dataset.encoder.encode(dataset.rows[0], 0)["model_inputs"]["input_ids"][0]
    item = dataset[0]
    assert item["input_ids"].tolist() == full[:48].tolist() and item["attention_mask"].all()
    # vLLM's prompt is the same cut with the picture's 16 pads written as one
    assert pad_counts(item["raw_prompt_ids"], tokenizer) == (1, 0) and len(item["raw_prompt_ids"]) == 48 - 15
    image_pad = tokenizer.convert_tokens_to_ids("<|image_pad|>")
    collapsed = [t for i, t in enumerate(item["input_ids"].tolist()) if t != image_pad or full[i - 1] != image_pad]
    assert item["raw_prompt_ids"] == collapsed
    assert "cut to their first 48 tokens" in caplog.text and "skipped 1 of 2 rows that truncation" in caplog.text


def test_text_rows_of_a_picture_dataset_carry_an_empty_media_slot(tmp_path, vl_tokenizer_and_processor):
    # so that a batch of text rows alone still concatenates with batches of pictures (online filtering rounds)
    from easyrl.protocol import DataProto

    tokenizer, processor = vl_tokenizer_and_processor
    picture(56, 56).save(tmp_path / "a.png")
    rows = [{"prompt": "text", "answer": "0", "images": []}, {"prompt": "<image>", "answer": "1", "images": ["a.png"]}]
    dataset = RLHFDataset(write_jsonl(tmp_path / "d.jsonl", rows), tokenizer, processor, vl_config(tmp_path))
    text_only, with_picture = collate_fn([dataset[0]]), collate_fn([dataset[1]])
    assert list(text_only.non_tensor_batch["multi_modal_data"]) == [None]
    merged = DataProto.concat([text_only, with_picture])
    assert merged.non_tensor_batch["multi_modal_data"][1]["images"][0].size == (56, 56)


def test_verl_geometry_rows_with_the_picture_placeholder_inside_a_chat_message(tmp_path, vl_tokenizer_and_processor):
    # verl's geo3k: prompt = [{"role": "user", "content": "<image>..."}], images = [{"bytes", "path"}], the answer in
    # reward_model.ground_truth
    tokenizer, processor = vl_tokenizer_and_processor
    rows = [
        {
            "prompt": [{"role": "user", "content": "<image>Find x. Put the answer in \\boxed{}."}],
            "images": [{"bytes": png_bytes(picture(56, 56, i)), "path": None}],
            "reward_model": {"ground_truth": str(i), "style": "rule"},
        }
        for i in range(2)
    ]
    datasets.Dataset.from_list(rows).to_parquet(str(tmp_path / "geo.parquet"))
    data_config = vl_config(tmp_path, answer_key="reward_model.ground_truth")
    item = RLHFDataset(str(tmp_path / "geo.parquet"), tokenizer, processor, data_config)[1]
    assert item["ground_truth"] == "1" and len(item["multi_modal_data"]["images"]) == 1
    assert pad_counts(item["input_ids"], tokenizer) == (4, 0)
    text = tokenizer.decode(item["raw_prompt_ids"])
    assert "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>Find x." in text


def test_a_content_parts_own_sampling_keys_are_said_to_be_unread_once(caplog):
    """Data written for qwen-vl-utils sets fps / max_frames / max_pixels per part; easyrl samples every row by the
    data.* keys. Before: those keys were dropped without a word (a 10 s video at fps 1 became 20 frames at 2 fps)."""
    from easyrl.data import template

    template._warn_part_options.cache_clear()
    part = {"type": "video", "video": "v.mp4", "fps": 1.0, "max_frames": 2}
    prompt = [{"role": "user", "content": [part, {"type": "text", "text": "What happens?"}]}]
    with caplog.at_level("WARNING", logger="easyrl.data.template"):
        assert media_in_messages(prompt) == ([], ["v.mp4"])
        assert media_in_messages(prompt) == ([], ["v.mp4"])  # the next row: not said again
        assert media_in_messages([{"role": "user", "content": [{"type": "image", "image": "a.png"}]}]) == (
            ["a.png"],
            [],
        )
    (said,) = [record.getMessage() for record in caplog.records]
    assert "sets `fps`, `max_frames`, which easyrl does not read per part" in said
    assert "data.max_frames, data.video_fps" in said


def test_a_frame_list_that_is_empty_or_of_mixed_sizes_says_what_to_fix():
    """Before: the reasons were "float division by zero" and torch's "stack expects each tensor to be equal size"."""
    from PIL import Image

    with pytest.raises(UnreadableMediaError, match="a video given as a list of frames has none"):
        load_video([])
    mixed = [Image.new("RGB", (56, 56)), Image.new("RGB", (112, 56)), Image.new("RGB", (56, 56))]
    with pytest.raises(UnreadableMediaError, match=r"are of 2 sizes \(56x56: frames 0, 2; 112x56: frame 1\); give"):
        load_video(mixed)
    frames, _ = load_video([Image.new("RGB", (56, 56))] * 2)
    assert frames.shape[:2] == (2, 3)  # one size: read (and resized as any video)


def test_a_frame_list_of_mixed_sizes_names_each_frame_file_and_its_size(tmp_path):
    """Before: "are of 2 sizes (56x56, 60x40)", without saying which frame had which."""
    Image.new("RGB", (60, 40)).save(tmp_path / "f0.png")
    Image.new("RGB", (56, 56)).save(tmp_path / "pic.png")
    with pytest.raises(UnreadableMediaError) as raised:
        load_video(["f0.png", "pic.png", "pic.png"], str(tmp_path))
    assert "are of 2 sizes (56x56: frames 1 'pic.png', 2 'pic.png'; 60x40: frame 0 'f0.png')" in str(raised.value)


def write_grey_video(path, width: int, height: int, count: int = 8, rate: int = 8) -> None:
    import av

    with av.open(str(path), "w") as container:
        stream = container.add_stream("mpeg4", rate=rate)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        for i in range(count):
            frame = av.VideoFrame.from_ndarray(np.full((height, width, 3), 20 * i, np.uint8), format="rgb24")
            container.mux(stream.encode(frame))
        container.mux(stream.encode())


def test_a_wide_video_is_sized_as_a_picture_of_its_frame_size(tmp_path, vl_tokenizer_and_processor):
    """Before: a 640x16 video was skipped with "height and width must be > 0" while the same picture loaded."""
    tokenizer, processor = vl_tokenizer_and_processor
    write_grey_video(tmp_path / "wide.mp4", 640, 16)  # 1 s at 8 fps
    row = {"prompt": "<video>Wide?", "answer": "x", "videos": ["wide.mp4"]}
    config = vl_config(tmp_path, min_pixels=784, max_pixels=12544)
    dataset = RLHFDataset(write_jsonl(tmp_path / "d.jsonl", [row]), tokenizer, processor, config)
    assert dataset.unusable_rows == []
    (frames,) = dataset[0]["multi_modal_data"]["videos"]
    picture_size = load_image(picture(640, 16), sizing=PictureSizing.from_processor(processor, 784, 12544)).size
    assert picture_size == (448, 28) and frames.shape == (2, 3, 28, 448)  # 2 fps: 2 of the 8 frames
    # 1 time step x (1 x 16) merged tokens
    assert pad_counts(dataset[0]["input_ids"], tokenizer) == (0, 16)


def test_video_frames_use_the_clamped_pixel_limits_that_pictures_use(tmp_path, vl_tokenizer_and_processor, caplog):
    """Before: with data.min_pixels=262144 (above the tiny processor's 12544) a 56x56 video was stored at 560x560,
    then resized again by the processor; pictures were stored at 112x112."""
    tokenizer, processor = vl_tokenizer_and_processor
    write_grey_video(tmp_path / "v.mp4", 56, 56)
    picture(56, 56).save(tmp_path / "p.png")
    row = {"prompt": "<video><image>Both?", "answer": "x", "videos": ["v.mp4"], "images": ["p.png"]}
    config = vl_config(tmp_path, min_pixels=262144, max_pixels=4194304)
    from easyrl.data.vision import _warn_clamped

    _warn_clamped.cache_clear()  # said once per process and value: another test may have said it already
    with caplog.at_level("WARNING", logger="easyrl.data.vision"):
        dataset = RLHFDataset(write_jsonl(tmp_path / "d.jsonl", [row]), tokenizer, processor, config)
    media = dataset[0]["multi_modal_data"]
    assert media["images"][0].size == (112, 112)
    assert media["videos"][0].shape == (2, 3, 112, 112)
    assert "pictures and video frames are sized with 12544" in caplog.text


def test_an_sft_answer_holding_the_picture_is_a_skipped_prompt_row(tmp_path, vl_tokenizer_and_processor, caplog):
    """An SFT conversation as RL/eval data loses its answer; a picture placed in that answer moved into the question."""
    tokenizer, processor = vl_tokenizer_and_processor
    picture(56, 56).save(tmp_path / "a.png")
    rows = [
        {
            "messages": [{"role": "user", "content": "<image> Colour?"}, {"role": "assistant", "content": "Red."}],
            "answer": "red",
            "images": ["a.png"],
        },
        {
            "messages": [
                {"role": "user", "content": "Colour?"},
                {"role": "assistant", "content": [{"type": "text", "text": "Here: "}, {"type": "image"}]},
            ],
            "answer": "red",
            "images": ["a.png"],
        },
        {
            "messages": [{"role": "user", "content": "Colour?"}, {"role": "assistant", "content": "See <image>"}],
            "answer": "red",
            "images": ["a.png"],
        },
    ]
    with caplog.at_level("WARNING", logger="easyrl.data.dataset"):
        dataset = RLHFDataset(
            write_jsonl(tmp_path / "sft.jsonl", rows), tokenizer, processor, vl_config(tmp_path, prompt_key="messages")
        )
    assert len(dataset) == 1 and "Red." not in tokenizer.decode(dataset[0]["raw_prompt_ids"])
    assert pad_counts(dataset[0]["input_ids"], tokenizer) == (4, 0)
    assert "the conversation's closing assistant messages, its answer, which a prompt leaves out, hold a picture" in (
        caplog.text
    )
    assert [reason for _, reason in dataset.unusable_rows] == [
        "the conversation's closing assistant messages, its answer, which a prompt leaves out, hold a picture or "
        "video: give the question's pictures in its user messages"
    ] * 2
