"""The actor's log-probs on tiny random Qwen2-VL / Qwen2.5-VL / Qwen3-VL, in one process (fp32).

One batch mixes an image row, a text-only row, a two-image row and a video row; the reference is a plain Hugging Face
forward of each sequence alone with the processor's own outputs (the model computes its 3-D positions itself).
"""

import gc
import pickle

import numpy as np
import pytest
import torch

import easyrl  # noqa: F401  (torchvision shim before the Qwen-VL processors import it)
from easyrl.models.vision import _PIXEL_CACHE, MULTI_MODAL_KEY
from easyrl.testing.vl_batch import VLSample, make_vl_batch, random_image, random_video, reference_log_probs
from tests.fixtures.vl import LOG_PROB_TOLERANCE


FAMILIES = ["qwen2_vl", "qwen2_5_vl", "qwen3_vl"]
TEMPERATURE = 0.8
SAMPLES = [
    VLSample("Count the shapes.", images=[random_image(0)]),
    VLSample("Hello there, how are you?"),
    VLSample("Which picture is brighter?", images=[random_image(1), random_image(2, width=84, height=56)]),
    VLSample("What happens?", videos=[random_video(3)]),
]


@pytest.fixture(scope="module", params=FAMILIES)
def family_setup(request, tmp_path_factory):
    """(processor, plain HF model, mixed batch, reference log-probs) of one family."""
    from transformers import AutoModelForImageTextToText, AutoProcessor

    from easyrl.testing.tiny_vlms import build_tiny_vlm

    path = build_tiny_vlm(request.param, tmp_path_factory.mktemp(request.param))
    processor = AutoProcessor.from_pretrained(path)
    model = AutoModelForImageTextToText.from_pretrained(path, dtype=torch.float32, attn_implementation="sdpa")
    data = make_vl_batch(processor, str(path), SAMPLES, response_length=6, seed=1)
    data.meta_info["temperature"] = TEMPERATURE
    expected = reference_log_probs(model, processor, SAMPLES, data, TEMPERATURE)
    return processor, model, data, expected


def _actor_log_probs(processor, model, data, *, padding_free: bool, micro_batch_size: int, dynamic: bool = False):
    from easyrl.config import ActorConfig
    from easyrl.workers.actor import Actor

    config = ActorConfig(use_torch_compile=False)
    config.padding_free = padding_free
    config.dynamic_batching = dynamic
    config.micro_batch_size_per_device_for_experience = micro_batch_size
    log_probs, _ = Actor(config, model, processor=processor).compute_log_probs(data)
    return log_probs


@pytest.mark.timeout(120)
@pytest.mark.parametrize("padding_free", [False, True], ids=["padded", "padding_free"])
def test_actor_log_probs_equal_plain_hf_forward_on_a_mixed_media_batch(family_setup, padding_free):
    processor, model, data, expected = family_setup
    log_probs = _actor_log_probs(processor, model, data, padding_free=padding_free, micro_batch_size=len(data))
    torch.testing.assert_close(log_probs, expected, **LOG_PROB_TOLERANCE)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("padding_free", [False, True], ids=["padded", "padding_free"])
def test_micro_batches_of_one_give_the_full_batch_log_probs(family_setup, padding_free):
    # the text-only row's micro-batch encodes a blank picture in an extra sequence that must change nothing
    processor, model, data, expected = family_setup
    log_probs = _actor_log_probs(processor, model, data, padding_free=padding_free, micro_batch_size=1)
    torch.testing.assert_close(log_probs, expected, **LOG_PROB_TOLERANCE)


@pytest.mark.timeout(120)
def test_dynamic_batching_reorders_samples_with_their_own_media(family_setup):
    from easyrl.models.dynamic_batching import split_micro_batches

    processor, model, data, expected = family_setup
    _, permutation = split_micro_batches(data, 2, dynamic=True)
    assert permutation.tolist() != list(range(len(data)))  # the balanced split really reorders the samples
    log_probs = _actor_log_probs(processor, model, data, padding_free=True, micro_batch_size=2, dynamic=True)
    torch.testing.assert_close(log_probs, expected, **LOG_PROB_TOLERANCE)


def _vision_inputs(data, processor):
    from easyrl.models.vision import MULTI_MODAL_KEY, build_vision_inputs

    batch = data.batch
    return build_vision_inputs(
        batch["input_ids"], batch["attention_mask"], data.non_tensor_batch[MULTI_MODAL_KEY], processor
    )


def test_pictures_and_videos_are_encoded_together_in_the_order_of_their_pads(family_setup):
    processor, _, data, _ = family_setup
    inputs = _vision_inputs(data, processor)
    assert inputs.image_grid_thw.shape == (4, 3)  # rows 0, 2 and 3: one picture, two pictures, one video
    assert inputs.blank_tokens == 0
    assert not (inputs.input_ids == processor.video_token_id).any()  # video pads read as picture pads
    reversed_inputs = _vision_inputs(data[[3, 2, 1, 0]], processor)
    assert torch.equal(reversed_inputs.image_grid_thw, inputs.image_grid_thw[[3, 1, 2, 0]])


def test_samples_sharing_a_picture_get_the_same_pixels_as_separate_copies(family_setup):
    processor, _, data, _ = family_setup
    repeated = data.repeat(2, interleave=True)  # the n samples of a prompt share one media dict
    inputs, single = _vision_inputs(repeated, processor), _vision_inputs(data, processor)
    per_item = torch.split(single.pixel_values, single.image_grid_thw.prod(-1).tolist())
    # items in pad order: row 0 [picture 0], row 2 [pictures 1, 2], row 3 [video 3]; each row now twice
    expected = torch.cat([per_item[i] for i in (0, 0, 1, 2, 1, 2, 3, 3)])
    assert torch.equal(inputs.pixel_values, expected)


def test_a_text_only_micro_batch_still_encodes_one_blank_picture(family_setup):
    processor, _, data, _ = family_setup
    inputs = _vision_inputs(data[[1]], processor)
    assert inputs.blank_tokens == 1 and inputs.image_grid_thw.shape == (1, 3)


def test_media_rows_without_a_processor_name_the_model_path_key(family_setup):
    from easyrl.models.vision import MULTI_MODAL_KEY, require_processor

    _, _, data, _ = family_setup
    with pytest.raises(ValueError, match="worker.actor.model.model_path"):
        require_processor(data.non_tensor_batch[MULTI_MODAL_KEY], None)


# ----------------------------------------------------------------------------------------------------------------------
# pads sampled by the policy, and each picture processed once
# ----------------------------------------------------------------------------------------------------------------------
def _with_sampled_pads(data, processor):
    """A copy of ``data`` whose last response token is an image pad (rows 0, 1) or a video pad (row 3): tokens a
    policy may sample, which vLLM reads as text."""
    data = data.select(deepcopy=False)
    data.batch = data.batch.clone()
    prompt_length = data.batch["input_ids"].shape[-1] - data.batch["responses"].shape[-1]
    for row, token in ((0, processor.image_token_id), (1, processor.image_token_id), (3, processor.video_token_id)):
        last = int(data.batch["response_mask"][row].sum()) - 1
        data.batch["responses"][row, last] = token
        data.batch["input_ids"][row, prompt_length + last] = token
    return data


@pytest.mark.timeout(120)
@pytest.mark.parametrize("padding_free", [False, True], ids=["padded", "padding_free"])
def test_a_pad_sampled_at_the_end_of_a_response_is_scored_like_any_token(family_setup, padding_free):
    # before: "The prompt tokens hold more image/video pads than the row's multi_modal_data has pictures/videos"
    processor, model, data, _ = family_setup
    sampled = _with_sampled_pads(data, processor)
    assert _vision_inputs(sampled, processor).generated_pads == 3
    expected = reference_log_probs(model, processor, SAMPLES, sampled, TEMPERATURE)
    for micro_batch_size in (1, len(data)):  # row 1 alone is a micro-batch without pictures
        log_probs = _actor_log_probs(
            processor, model, sampled, padding_free=padding_free, micro_batch_size=micro_batch_size
        )
        torch.testing.assert_close(log_probs, expected, **LOG_PROB_TOLERANCE)


class CountingImageProcessor:
    """The processor's own image / video processor, counting the pictures it is given."""

    def __init__(self, inner):
        self.inner, self.items = inner, 0

    def __call__(self, *args, **kwargs):
        self.items += len(kwargs.get("images") or kwargs.get("videos") or args[0])
        return self.inner(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self.inner, name)


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("padding_free", "micro_batch_size", "dynamic"),
    [(True, 1, False), (False, 3, False), (True, 4, True)],
    ids=["padding_free-mb1", "padded-mb3", "dynamic"],
)
def test_each_picture_is_processed_once_per_call_however_the_batch_is_cut(
    family_setup, monkeypatch, padding_free, micro_batch_size, dynamic
):
    from easyrl.models.vision import clear_pixel_cache

    processor, model, data, expected = family_setup
    images = CountingImageProcessor(processor.image_processor)
    videos = CountingImageProcessor(processor.video_processor)
    monkeypatch.setattr(processor, "image_processor", images)
    monkeypatch.setattr(processor, "video_processor", videos)
    clear_pixel_cache()
    # 3 samples per prompt, shipped to a worker as Ray does (one pickle: the 3 share their pictures again there)
    repeated = pickle.loads(pickle.dumps(data.repeat(3, interleave=True)))
    for _ in range(2):  # e.g. old log-probs, then the update's forward, on the same shipped batch
        log_probs = _actor_log_probs(
            processor, model, repeated, padding_free=padding_free, micro_batch_size=micro_batch_size, dynamic=dynamic
        )
        torch.testing.assert_close(log_probs, expected.repeat_interleave(3, dim=0), **LOG_PROB_TOLERANCE)
    assert (images.items, videos.items) == (3, 1)  # pictures 0, 1, 2 and video 3, once each
    del repeated, log_probs
    gc.collect()
    assert not _PIXEL_CACHE  # the batch is gone, and its pixels with it


def test_pictures_stay_with_their_samples_through_shipping_union_and_concat(family_setup):
    from easyrl.protocol import DataProto

    processor, _, data, _ = family_setup
    first = pickle.loads(pickle.dumps(data.repeat(2, interleave=True)))
    rows = first.non_tensor_batch[MULTI_MODAL_KEY]
    assert rows[0]["images"][0] is rows[1]["images"][0]  # the two samples of prompt 0 share one picture object
    second = pickle.loads(pickle.dumps(data[[3, 0]]))
    scored = DataProto.from_dict(non_tensors={"score": np.arange(len(first), dtype=object)})
    merged = DataProto.concat([first.union(scored).select_rows(np.arange(8)), second.union(scored[:2])])
    inputs, single = _vision_inputs(merged, processor), _vision_inputs(data, processor)
    per_item = torch.split(single.pixel_values, single.image_grid_thw.prod(-1).tolist())
    # items in pad order: rows 0 0 1 1 2 2 3 3 (picture 0, -, pictures 1 2, video 3, twice each) then rows 3, 0
    expected = torch.cat([per_item[i] for i in (0, 0, 1, 2, 1, 2, 3, 3, 3, 0)])
    assert torch.equal(inputs.pixel_values, expected)


def test_a_prompt_pad_whose_picture_went_missing_is_an_error_not_a_sampled_token(family_setup):
    from easyrl.models.vision import build_vision_inputs

    processor, _, data, _ = family_setup
    lost = data.select(deepcopy=False)
    lost.non_tensor_batch = {MULTI_MODAL_KEY: np.array([None, None, *data.non_tensor_batch[MULTI_MODAL_KEY][2:]])}
    batch = lost.batch
    with pytest.raises(ValueError, match="Sample 0 of the micro-batch has 6 vision pad token.*lost media"):
        build_vision_inputs(
            batch["input_ids"], batch["attention_mask"], lost.non_tensor_batch[MULTI_MODAL_KEY], processor, 6
        )
    # picture 0 (56 x 84) is 2 x 3 merged tokens with patch 14 and 3 x 2 with patch 16: 6 pads either way
    only_text = lost[[0, 1]]  # a micro-batch without any picture left: the same check
    with pytest.raises(ValueError, match="Sample 0 of the micro-batch has 6 vision pad token"):
        build_vision_inputs(
            only_text.batch["input_ids"], only_text.batch["attention_mask"], [None, None], processor, 6
        )


def test_a_prompt_cut_inside_a_picture_is_an_error_naming_the_sample(family_setup):
    processor, _, data, _ = family_setup
    cut = data.select(deepcopy=False)
    cut.batch = cut.batch.clone()
    first_pad = int(torch.nonzero(cut.batch["input_ids"][2] == processor.image_token_id)[0])
    cut.batch["attention_mask"][2, : first_pad + 2] = 0  # two pads of sample 2's first picture gone
    # the first picture takes the next pads in line, the second finds two too few
    with pytest.raises(ValueError, match="Sample 2 of the micro-batch has 1 picture\\(s\\)/video\\(s\\) without"):
        _vision_inputs(cut, processor)
