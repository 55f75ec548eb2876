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


def write_video(path, count: int, rate: int) -> None:
    """A PyAV mpeg4 video of ``count`` 168 x 56 frames (a size every resize keeps) at ``rate`` fps; frame i spells i
    in base 16, one 56 x 56 block per digit (grey level 16 x digit + 8, far enough apart to survive the lossy
    codec)."""
    import av

    with av.open(str(path), "w") as container:
        stream = container.add_stream("mpeg4", rate=rate)
        stream.width, stream.height, stream.pix_fmt = 168, 56, "yuv420p"
        for i in range(count):
            digits = [(i >> (4 * block)) % 16 for block in range(3)]
            pixels = np.concatenate([np.full((56, 56, 3), 16 * d + 8, np.uint8) for d in digits], axis=1)
            container.mux(stream.encode(av.VideoFrame.from_ndarray(pixels, "rgb24")))
        container.mux(stream.encode())


def spelled_index(frames: torch.Tensor) -> list[int]:
    return [
        sum(int(f[:, 16:40, 56 * b + 16 : 56 * b + 40].float().mean()) // 16 << (4 * b) for b in range(3))
        for f in frames
    ]


def test_a_video_slower_than_video_fps_keeps_its_own_rate(tmp_path, vl_tokenizer_and_processor):
    """Before: a 6 s clip at 1 fps came back at rate 2.0 (video_fps), so the model was told it lasts 3 s."""
    _, processor = vl_tokenizer_and_processor
    write_video(tmp_path / "slow.mp4", 6, rate=1)
    frames, fps = load_video("slow.mp4", str(tmp_path), fps=2.0, min_pixels=784, max_pixels=12544)
    assert spelled_index(frames) == [0, 1, 2, 3, 4, 5] and fps == pytest.approx(1.0)
    # qwen-vl-utils' readers: nframes / total_frames x the file's rate = 4 / 6 x 1
    frames, fps = load_video("slow.mp4", str(tmp_path), fps=2.0, min_pixels=784, max_pixels=12544, max_frames=4)
    assert spelled_index(frames) == [0, 2, 3, 5] and fps == pytest.approx(4 / 6)
    # the processor spaces the 2 temporal steps of the 4 frames 3 s apart: 4 frames over the real 6 s
    from easyrl.data.dataset import process_with_media

    inputs = process_with_media(processor, "<|vision_start|><|video_pad|><|vision_end|>", [], [frames], [fps])
    assert inputs["second_per_grid_ts"].tolist() == pytest.approx([3.0])


def test_a_long_video_file_keeps_the_sampled_frames_decoded_in_a_stream(tmp_path):
    write_video(tmp_path / "long.mp4", 1500, rate=50)  # 30 s
    frames, fps = load_video("long.mp4", str(tmp_path), fps=2.0, min_pixels=784, max_pixels=12544)
    # every 25th frame: 60 frames, 0, 25, ..., 1475, at 2 fps
    assert spelled_index(frames) == list(range(0, 1500, 25)) and fps == pytest.approx(2.0)
    frames, fps = load_video("long.mp4", str(tmp_path), fps=2.0, min_pixels=784, max_pixels=12544, max_frames=4)
    # sampled frames 0, 20, 39, 59 of the 60 (budget_frame_indices) = file frames 0, 500, 975, 1475
    assert spelled_index(frames) == [0, 500, 975, 1475] and fps == pytest.approx(4 / 1500 * 50)


def test_a_video_file_without_a_frame_count_in_its_header_keeps_the_same_frames(tmp_path):
    import av

    write_video(tmp_path / "long.mkv", 300, rate=50)
    with av.open(str(tmp_path / "long.mkv")) as container:
        assert container.streams.video[0].frames == 0  # Matroska stores no count: the reader counts by decoding
    frames, fps = load_video("long.mkv", str(tmp_path), fps=5.0, min_pixels=784, max_pixels=12544)
    assert spelled_index(frames) == list(range(0, 300, 10)) and fps == pytest.approx(5.0)


def test_a_video_file_keeps_at_most_768_frames_without_a_budget_as_qwen_vl_utils_readers(tmp_path):
    """Before: the PyAV reader had no cap (a 10-minute clip at 2 fps kept 1200 frames)."""
    write_video(tmp_path / "long.mp4", 1600, rate=20)
    frames, fps = load_video("long.mp4", str(tmp_path), fps=10.0, min_pixels=784, max_pixels=12544)
    # 10 fps samples every 2nd frame: 800 frames, spread down to 768 over the whole video, at 768 / 1600 x 20 fps
    assert frames.shape[0] == 768 and fps == pytest.approx(9.6)
    kept = spelled_index(frames)
    assert kept[:3] == [0, 2, 4] and kept[-1] == 1598
    assert kept == [2 * i for i in budget_frame_indices(800, 768)]
    # a budget above 768 is honoured, as qwen-vl-utils' readers honour max_frames
    frames, _ = load_video("long.mp4", str(tmp_path), fps=10.0, min_pixels=784, max_pixels=12544, max_frames=800)
    assert frames.shape[0] == 800


def test_a_video_file_is_decoded_in_a_stream_holding_only_the_kept_frames(tmp_path):
    """Before: every frame became a full-size picture before sampling (a 60 s 320x240 clip: +1 GB)."""
    import subprocess
    import sys

    import av

    with av.open(str(tmp_path / "big.mp4"), "w") as container:
        stream = container.add_stream("mpeg4", rate=50)
        stream.width, stream.height, stream.pix_fmt = 320, 240, "yuv420p"
        for i in range(1500):  # 30 s; as pictures 1500 x 230 KB = 345 MB, the 60 kept at 2 fps 14 MB
            container.mux(
                stream.encode(av.VideoFrame.from_ndarray(np.full((240, 320, 3), i % 256, np.uint8), "rgb24"))
            )
        container.mux(stream.encode())
    # a fresh process, so that the peak memory (ru_maxrss) is this video's alone
    probe = (
        "import resource; from easyrl.data.vision import load_video; "
        "before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss; "
        f"frames, _ = load_video({str(tmp_path / 'big.mp4')!r}, fps=2.0, min_pixels=784, max_pixels=12544); "
        "print(len(frames), (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) // 1024)"
    )
    count, grown_mb = map(
        int, subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout.split()
    )
    assert count == 60 and grown_mb < 100
