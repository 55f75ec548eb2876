"""Image and video rows with a tiny offline Qwen2.5-VL processor: media loading, vision pads, 3-D rope ids."""

import io
import json

import datasets
import numpy as np
import pytest
import torch
from PIL import Image

from easyrl.config import DataConfig
from easyrl.data.collate import collate_fn
from easyrl.data.dataset import RLHFDataset
from easyrl.data.vision import UnreadableMediaError, load_image, load_video


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
    assert "skipped 1 of 2 rows whose pictures/videos or prompts cannot be used (row 1: cannot read image 'broken.png'" in caplog.text


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
