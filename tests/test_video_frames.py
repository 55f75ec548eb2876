"""The per-video frame budget (`data.max_frames`): which frames a long video keeps, and that the dataset, the actor's
processor inputs and the rollout engine's multi_modal_data all carry those same frames."""

import json

import numpy as np
import pytest
import torch
from PIL import Image

from easyrl.config import ConfigError, DataConfig, load_run_plan
from easyrl.data.dataset import RLHFDataset
from easyrl.data.vision import budget_frame_indices, load_video
from easyrl.models.vision import _pixels_once
from easyrl.workers.rollout.vllm_rollout import _vllm_multi_modal_data


def frame(index: int) -> Image.Image:
    """A 56 x 56 frame whose colour spells its index (red = index % 256, green = index // 256)."""
    return Image.fromarray(np.full((56, 56, 3), (index % 256, index // 256, 7), np.uint8))


def frame_index(frames: torch.Tensor) -> list[int]:
    return [int(f[0, 0, 0]) + 256 * int(f[1, 0, 0]) for f in frames]


def test_budget_indices_are_evenly_spread_with_first_and_last_frame():
    # round(i * 9 / 3) = 0, 3, 6, 9
    assert budget_frame_indices(10, 4) == [0, 3, 6, 9]
    # round(i * 999 / 7): 142.71 -> 143, 285.43 -> 285, 428.14 -> 428, 570.86 -> 571, 713.57 -> 714, 856.29 -> 856
    assert budget_frame_indices(1000, 8) == [0, 143, 285, 428, 571, 714, 856, 999]
    # halves round up: round(i * 4 / 2) with count 5, budget 3 -> 0, 2, 4; count 4, budget 3 -> 0, 1.5 -> 2, 3
    assert budget_frame_indices(4, 3) == [0, 2, 3]
    assert budget_frame_indices(1000, None) == list(range(1000))
    assert budget_frame_indices(6, 6) == list(range(6)) and budget_frame_indices(3, 8) == [0, 1, 2]


def test_a_1000_frame_video_keeps_the_budgeted_frames_and_a_proportionally_lower_rate():
    frames, fps = load_video([frame(i) for i in range(1000)], fps=2.0, min_pixels=784, max_pixels=3136, max_frames=8)
    assert frames.shape == (8, 3, 56, 56) and frames.dtype == torch.uint8
    assert frame_index(frames) == [0, 143, 285, 428, 571, 714, 856, 999]
    # 1000 frames at 2 fps span 500 s; 8 frames over the same 500 s come at 8 / 500 = 0.016 per second
    assert fps == pytest.approx(2.0 * 8 / 1000)


def test_without_a_budget_every_frame_is_kept():
    frames, fps = load_video([frame(i) for i in range(6)], fps=2.0, min_pixels=784, max_pixels=3136)
    assert frame_index(frames) == [0, 1, 2, 3, 4, 5] and fps == 2.0
    assert DataConfig().max_frames is None


def test_dataset_actor_and_engine_see_the_same_budgeted_frames(tmp_path, vl_tokenizer_and_processor):
    tokenizer, processor = vl_tokenizer_and_processor
    for i in range(1000):
        frame(i).save(tmp_path / f"f{i}.png")
    row = {"prompt": "What moves?", "answer": "x", "videos": [[f"f{i}.png" for i in range(1000)]]}
    (tmp_path / "d.jsonl").write_text(json.dumps(row))
    config = DataConfig(image_dir=str(tmp_path), max_prompt_length=160, min_pixels=784, max_pixels=3136, max_frames=8)
    item = RLHFDataset(str(tmp_path / "d.jsonl"), tokenizer, processor, config)[0]
    media = item["multi_modal_data"]
    (frames,) = media["videos"]
    assert frame_index(frames) == [0, 143, 285, 428, 571, 714, 856, 999]
    assert media["video_fps"] == [pytest.approx(0.016)]
    # 8 frames / temporal patch 2 = 4 steps of 2 x 2 merged tokens each
    video_pad = tokenizer.convert_tokens_to_ids("<|video_pad|>")
    assert int((item["input_ids"] == video_pad).sum()) == 16
    # the engine gets the very same frames, told to take every one of them at the lowered rate
    ((engine_frames, metadata),) = _vllm_multi_modal_data(media)["video"]
    assert engine_frames is frames
    assert metadata["total_num_frames"] == 8 and metadata["fps"] == pytest.approx(0.016)
    assert metadata["do_sample_frames"] is False
    # the actor builds its pixels from the same frames: 4 time steps x 4 x 4 patches, 16 tokens after the merge
    ((_, grid),) = _pixels_once(processor, "video", [frames])
    assert grid.tolist() == [4, 4, 4]


@pytest.mark.parametrize(
    "budget, error",
    [("7", r"`data\.max_frames` \(7\) must be even.*use 6 or 8"), ("0", r"`data\.max_frames` is 0; it must be >= 2")],
)
def test_an_odd_or_empty_budget_is_refused_naming_the_key(valid_args, budget, error):
    with pytest.raises(ConfigError, match=error):
        load_run_plan([*valid_args, f"data.max_frames={budget}"])
    assert load_run_plan([*valid_args, "data.max_frames=32"]).config.data.max_frames == 32


def test_a_video_file_is_sampled_at_video_fps_then_cut_to_the_budget(tmp_path):
    import av

    with av.open(str(tmp_path / "clip.mp4"), "w") as container:
        stream = container.add_stream("mpeg4", rate=4)
        stream.width, stream.height, stream.pix_fmt = 56, 56, "yuv420p"
        for i in range(20):  # 5 seconds at 4 fps, frame i has grey level 10 * i
            container.mux(stream.encode(av.VideoFrame.from_ndarray(np.full((56, 56, 3), i * 10, np.uint8), "rgb24")))
        container.mux(stream.encode())
    frames, fps = load_video("clip.mp4", str(tmp_path), fps=2.0, min_pixels=784, max_pixels=3136, max_frames=4)
    # 2 fps keeps every second frame (10 frames: 0, 2, ..., 18); the budget keeps 0, 3, 6, 9 of those = 0, 6, 12, 18
    assert frames.shape == (4, 3, 56, 56)
    grey = [int(f.float().mean().round()) for f in frames]
    assert grey == pytest.approx([0, 60, 120, 180], abs=3)  # mpeg4 is lossy
    assert fps == pytest.approx(2.0 * 4 / 10)
