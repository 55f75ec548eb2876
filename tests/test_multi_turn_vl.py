"""Multi-turn rollouts on a vision-language model whose tools return pictures (tiny random Qwen2.5-VL).

A tool result with a picture is rendered by the chat template with ONE image pad (what vLLM reads back at the next
turn, the picture in its multi_modal_data) and enters the actor's copy of the response with the pad expanded to the
picture's vision tokens; the row's multi_modal_data holds the prompt's picture then the tool's, the response's 3-D
rope positions are the model's own over the whole sequence, and the tool tokens stay out of response_mask. The turn
bookkeeping runs with a scripted turn source; the real engine in the FSDP worker checks the actor's log-probs against
vLLM's on the model tokens.
"""

import contextlib
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import easyrl  # noqa: F401  (process environment before Ray starts)
from easyrl.config.schema import MultiTurnConfig
from easyrl.data.rope import make_position_id_fn
from easyrl.models.vision import build_vision_inputs
from easyrl.testing.vl_batch import VLSample, processor_inputs, random_image
from easyrl.workers.rollout.base import rollout_logprob_mismatch
from easyrl.workers.rollout.multi_turn import MultiTurnRollout, to_content
from easyrl.workers.tool_files import load_tools, tool_schema
from tests.test_multi_turn import LOGPROB_TOLERANCE, _runs, scripted_engine
from tests.test_multi_turn_tool_env import chat_prompts


# A tool that shows the model a part of the row's own picture: it takes `row` (the prompt's dataset row), which the
# schema leaves out. The crop is 56 x 56 pixels: 2 x 2 vision tokens after the 2 x 2 merge of 14-pixel patches.
LOOK_TOOLS = '''
def look(corner: str, row: dict) -> list:
    """Look at a corner of the picture.

    Args:
        corner: Which corner, e.g. "top left".
    """
    picture = row["multi_modal_data"]["images"][0]
    return ["Here:", picture.crop((0, 0, 56, 56))]


TOOLS = [look]
'''
CALL = '<tool_call>{"name": "look", "arguments": {"corner": "top left"}}</tool_call>'
# the tool message as the Qwen2.5-VL template renders it after a turn that ended with <|im_end|>: one pad per picture
TOOL_TEXT = "\n<|im_start|>tool\nHere:<|vision_start|><|image_pad|><|vision_end|><|im_end|>\n<|im_start|>assistant\n"
CROP_TOKENS = 4  # 56 x 56 pixels
PROMPT_IMAGE = {"width": 56, "height": 84}  # 4 x 6 patches: 6 vision tokens


@pytest.fixture
def look_tools(tmp_path):
    path = tmp_path / "look_tools.py"
    path.write_text(LOOK_TOOLS)
    return str(path)


def vl_prompts(processor, model_path, samples: list[VLSample]):
    """A prompt DataProto as the dataset makes it for picture rows: left-padded ids with the pads expanded, (batch, 3,
    len) rope positions, raw ids with one pad per picture (vLLM's), and each row's multi_modal_data."""
    from easyrl.protocol import DataProto

    positions_of = make_position_id_fn(processor, model_path=str(model_path))
    encoded = [processor_inputs(processor, sample) for sample in samples]
    length = max(e["input_ids"].shape[-1] for e in encoded)
    input_ids = torch.full((len(samples), length), processor.tokenizer.pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros_like(input_ids)
    position_ids = torch.zeros(len(samples), 3, length, dtype=torch.long)
    raw, media = np.empty(len(samples), dtype=object), np.empty(len(samples), dtype=object)
    for i, (sample, inputs) in enumerate(zip(samples, encoded)):
        n = inputs["input_ids"].shape[-1]
        input_ids[i, length - n :] = inputs["input_ids"][0]
        attention_mask[i, length - n :] = 1
        position_ids[i, :, length - n :] = positions_of(inputs)
        messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": sample.text}]}]
        text = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        raw[i] = processor.tokenizer(text, add_special_tokens=False)["input_ids"]
        media[i] = {"images": sample.images}
    return DataProto.from_dict(
        tensors={"input_ids": input_ids, "attention_mask": attention_mask, "position_ids": position_ids},
        non_tensors={"raw_prompt_ids": raw, "multi_modal_data": media},
    )


def widened(prompts, extra: int, pad_token_id: int):
    """``prompts`` left-padded by ``extra`` more columns: room (data.max_prompt_length) for what a reset adds."""
    for key in ("input_ids", "attention_mask", "position_ids"):
        value = prompts.batch[key]
        fill = pad_token_id if key == "input_ids" else 0
        prompts.batch[key] = torch.cat([torch.full((*value.shape[:-1], extra), fill, dtype=value.dtype), value], -1)
    return prompts


def record_media(llm) -> list:
    """The multi_modal_data of each generate call's inputs, recorded as the scripted engine is called."""
    seen_media = []
    generate = llm.generate

    def recording_generate(inputs, params, use_tqdm, lora_request):
        seen_media.append([item.get("multi_modal_data") for item in inputs])
        return generate(inputs, params, use_tqdm, lora_request)

    llm.generate = recording_generate
    return seen_media


# ----------------------------------------------------------------------------------------------------------------------
# return shapes and the `row` argument
# ----------------------------------------------------------------------------------------------------------------------
def test_tool_returns_become_message_content_with_pictures_in_order():
    picture = Image.new("RGB", (28, 28))
    assert to_content("5") == ("5", [])
    assert to_content(7) == ("7", [])
    assert to_content(["a", 3]) == ("a\n3", [])
    assert to_content(picture) == ([{"type": "image"}], [picture])
    content, pictures = to_content(["Here:", picture, "and", picture])
    assert content == [
        {"type": "text", "text": "Here:"},
        {"type": "image"},
        {"type": "text", "text": "and"},
        {"type": "image"},
    ]
    assert pictures == [picture, picture]


def test_chat_content_parts_as_trls_multimodal_tools_return_them(tmp_path):
    """TRL's VLM environments answer with content blocks ({"type": "image", "image": ...}, {"type": "text", ...});
    the picture may be a PIL image, a file or a data URI (OpenAI's image_url too). A part easyrl cannot read is a tool
    error that names it."""
    import base64
    import io

    from easyrl.workers.rollout.multi_turn import ToolCall, run_tool_calls

    picture = Image.new("RGB", (28, 28), (200, 10, 10))
    saved = tmp_path / "frame.png"
    picture.save(saved)
    encoded = io.BytesIO()
    picture.save(encoded, format="PNG")
    uri = "data:image/png;base64," + base64.b64encode(encoded.getvalue()).decode()
    content, pictures = to_content(
        [
            {"type": "image", "image": picture},
            {"type": "text", "text": "Speed 3."},
            {"type": "image", "image": str(saved)},
            {"type": "image_url", "image_url": {"url": uri}},
        ]
    )
    assert content == [
        {"type": "image"},
        {"type": "text", "text": "Speed 3."},
        {"type": "image"},
        {"type": "image"},
    ]
    assert pictures[0] is picture
    assert [p.size for p in pictures[1:]] == [(28, 28)] * 2
    assert all(p.getpixel((5, 5)) == (200, 10, 10) for p in pictures[1:])
    # text parts alone are text, and a dict of another shape stays as it was written
    assert to_content([{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]) == ("a\nb", [])
    # a dict is JSON text, as function-calling models read results (not Python's repr)
    assert to_content([{"speed": 3}]) == ('{"speed": 3}', [])
    assert to_content({"ok": True, "error": None, "name": "café"}) == (
        '{"ok": true, "error": null, "name": "café"}',
        [],
    )
    assert to_content({"when": picture.size, "what": picture}) == (f'{{"when": [28, 28], "what": "{picture}"}}', [])

    def observe():
        return [{"type": "image", "image": str(tmp_path / "missing.png")}]

    (result,), _ = run_tool_calls([ToolCall("observe", {})], {"observe": observe}, timeout=5.0)
    assert result.error and "missing.png" in result.content


def test_a_tool_taking_row_gets_it_and_the_schema_hides_it(look_tools):
    (look,) = load_tools(look_tools).values()
    schema = tool_schema(look)["function"]
    assert schema["name"] == "look"
    assert schema["parameters"] == {
        "type": "object",
        "properties": {"corner": {"type": "string", "description": 'Which corner, e.g. "top left".'}},
        "required": ["corner"],
    }


ZOOM = str(Path(__file__).resolve().parent.parent / "tools" / "image_zoom.py")


def test_zoom_tool_returns_the_rows_picture_part_enlarged_and_refuses_bad_regions():
    zoom = load_tools(ZOOM)["zoom"]
    picture = Image.new("RGB", (112, 112), "white")
    picture.paste((255, 0, 0), (0, 0, 56, 56))  # the top left quarter is red
    row = {"multi_modal_data": {"images": [picture]}, "ground_truth": "1"}
    text, part = zoom(region="Top-Left", row=row)
    assert text == "Zoomed into the Top-Left of the picture (2.0x):"
    assert part.size == (112, 112) and part.getcolors() == [(112 * 112, (255, 0, 0))]
    text, part = zoom(bbox=[0.5, 0.0, 1.0, 0.1], row=row)  # 56 x 11 pixels: 4.5x would reach the area, 4x at most
    assert text == "Zoomed into the box [0.5, 0.0, 1.0, 0.1] of the picture (4.0x):" and part.size == (224, 44)
    assert part.getcolors() == [(224 * 44, (255, 255, 255))]
    assert "row" not in tool_schema(zoom)["function"]["parameters"]["properties"]
    for kwargs, message in [
        ({"region": "middle"}, "unknown region 'middle'; use one of: top left, top right"),
        ({"bbox": [0.5, 0.5, 0.5, 1.0]}, "is empty"),
        ({"bbox": [0, 1]}, "bbox must be four numbers"),
    ]:
        with pytest.raises(ValueError, match=message):
            zoom(row=row, **kwargs)
    with pytest.raises(ValueError, match="this prompt has no picture to zoom into"):
        zoom(region="top", row={"multi_modal_data": None})


# ----------------------------------------------------------------------------------------------------------------------
# turn bookkeeping with a scripted turn source and the real processor / template / rope
# ----------------------------------------------------------------------------------------------------------------------
def test_a_tool_picture_reaches_the_next_turn_the_rows_pictures_and_the_rope(vl_tokenizer_and_processor, look_tools):
    tokenizer, processor = vl_tokenizer_and_processor
    model_path = Path(processor.tokenizer.name_or_path)
    eos, pad = tokenizer.eos_token_id, processor.image_token_id
    encode = lambda text: tokenizer.encode(text, add_special_tokens=False)  # noqa: E731
    call = encode(CALL) + [eos]
    answer = encode("A red square.") + [eos]
    sampled_pad_call = encode("Hm") + [pad] + call  # the policy sampled a vision pad: text, not a picture
    turns = {0: [call, answer], 1: [sampled_pad_call, answer]}
    engine, llm = scripted_engine(tokenizer, turns, response_length=64)
    seen_media = record_media(llm)
    rollout = MultiTurnRollout(
        engine, MultiTurnConfig(tools=look_tools, max_turns=3), processor=processor, model_path=str(model_path)
    )
    image = random_image(0, **PROMPT_IMAGE)
    prompts = vl_prompts(processor, model_path, [VLSample("Describe it.", [image]), VLSample("What is it?", [image])])
    out = rollout.generate_sequences(prompts)

    tool = encode(TOOL_TEXT)
    tool_expanded = [token for t in tool for token in ([pad] * CROP_TOKENS if t == pad else [t])]
    raw = prompts.non_tensor_batch["raw_prompt_ids"]
    # vLLM's second turn: one pad for the tool picture, the prompt's picture then the crop in its multi_modal_data
    assert llm.seen[1] == [list(raw[0]) + call + tool, list(raw[1]) + encode("Hm") + [eos] + call + tool]
    crop = out.non_tensor_batch["multi_modal_data"][0]["images"][1]
    assert [len(media["image"]) for media in seen_media[1]] == [2, 2] and seen_media[1][0]["image"][1] is crop
    assert crop.size == (56, 56) and np.array_equal(np.asarray(crop), np.asarray(image)[:56, :56])
    for row, first in enumerate([call, sampled_pad_call]):
        whole = first + tool_expanded + answer
        mask = [1] * len(first) + [0] * len(tool_expanded) + [1] * len(answer)
        assert out.batch["responses"][row, : len(whole)].tolist() == whole
        assert out.batch["response_mask"][row].tolist() == mask + [0] * (64 - len(whole))
        media = out.non_tensor_batch["multi_modal_data"][row]
        assert media["images"][0] is image and len(media["images"]) == 2
        assert out.non_tensor_batch["messages"][row][1] == {
            "role": "tool",
            "name": "look",
            "content": [{"type": "text", "text": "Here:"}, {"type": "image"}],
        }
    assert prompts.non_tensor_batch["multi_modal_data"][0] == {"images": [image]}  # the prompts' rows are untouched

    # positions: the model's own rope over the whole unpadded sequence (prompt + response, the sampled pad as text)
    grids = processor.image_processor(images=[image, crop], return_tensors="pt")["image_grid_thw"]
    positions_of = make_position_id_fn(processor, model_path=str(model_path))
    for row in range(2):
        attended = out.batch["attention_mask"][row].bool()
        ids = out.batch["input_ids"][row][attended]
        n_prompt = int(prompts.batch["attention_mask"][row].sum())
        sampled = torch.zeros_like(ids, dtype=torch.bool)
        if row == 1:
            sampled[n_prompt + 2] = True  # "Hm" is 2 tokens, then the sampled pad
        ids = torch.where(sampled, tokenizer.pad_token_id, ids)
        expected = positions_of({"input_ids": ids, "image_grid_thw": grids})
        assert torch.equal(out.batch["position_ids"][row][:, attended], expected), row

    # the actor pairs the prompt's picture and the crop with their pads; the sampled pad is read as text
    vision = build_vision_inputs(
        out.batch["input_ids"],
        out.batch["attention_mask"],
        out.non_tensor_batch["multi_modal_data"],
        processor,
        64,
        out.batch["response_mask"],
    )
    assert vision.image_grid_thw.tolist() == [[1, 6, 4], [1, 4, 4]] * 2 and vision.generated_pads == 1
    assert int((vision.input_ids == pad).sum()) == 2 * (6 + CROP_TOKENS)


def test_tool_pictures_are_held_to_the_runs_data_max_pixels_and_not_raised_to_min_pixels(
    vl_tokenizer_and_processor, tmp_path
):
    """data.max_pixels holds the pictures a tool returns as it holds the dataset's (through the rollout's derived
    copy): a 4K screenshot from a tool kept the processor's own 12.8 Mpx ceiling. data.min_pixels does not raise them:
    a tool chooses what it shows (its default, 512 x 512, would make a 56-pixel crop 334 vision tokens)."""
    from easyrl.config import load_config
    from easyrl.data.vision import PictureSizing

    tokenizer, processor = vl_tokenizer_and_processor
    model_path = Path(processor.tokenizer.name_or_path)
    tools = tmp_path / "two_tools.py"
    tools.write_text(
        LOOK_TOOLS.replace(
            '["Here:", picture.crop((0, 0, 56, 56))]', "[picture.resize((280, 168)), picture.crop((0, 0, 56, 56))]"
        )
    )
    encode = lambda text: tokenizer.encode(text, add_special_tokens=False)  # noqa: E731
    call, answer = encode(CALL) + [tokenizer.eos_token_id], encode("Done.") + [tokenizer.eos_token_id]
    derived = load_config(["data.min_pixels=8000", "data.max_pixels=6272"], validate=False).worker.rollout
    assert derived.max_pixels == 6272
    sizes = {}
    for name, high in {"processor": None, "data": 6272}.items():
        engine, _ = scripted_engine(tokenizer, {0: [call, answer]}, response_length=96)
        engine.config.max_pixels = high
        rollout = MultiTurnRollout(
            engine, MultiTurnConfig(tools=str(tools), max_turns=3), processor=processor, model_path=str(model_path)
        )
        image = random_image(0, **PROMPT_IMAGE)
        out = rollout.generate_sequences(vl_prompts(processor, model_path, [VLSample("Describe it.", [image])]))
        sizes[name] = [picture.size for picture in out.non_tensor_batch["multi_modal_data"][0]["images"][1:]]
    big = random_image(0, width=280, height=168)
    assert sizes["processor"] == [PictureSizing.from_processor(processor)(big).size, (56, 56)] == [(140, 84), (56, 56)]
    assert sizes["data"] == [PictureSizing.from_processor(processor, None, 6272)(big).size, (56, 56)]
    assert sizes["data"][0] == (84, 56)  # 4 x 6 patches: within 6272 pixels


def test_a_picture_that_does_not_fit_the_budget_is_left_out_whole(vl_tokenizer_and_processor, look_tools):
    tokenizer, processor = vl_tokenizer_and_processor
    model_path = Path(processor.tokenizer.name_or_path)
    call = tokenizer.encode(CALL, add_special_tokens=False) + [tokenizer.eos_token_id]
    tool = tokenizer.encode(TOOL_TEXT, add_special_tokens=False)
    before_pad = tool.index(processor.image_token_id)
    budget = len(call) + before_pad + 2  # room for 2 of the crop's 4 vision tokens
    engine, llm = scripted_engine(tokenizer, {0: [call, call]}, response_length=budget)
    rollout = MultiTurnRollout(
        engine, MultiTurnConfig(tools=look_tools, max_turns=3), processor=processor, model_path=str(model_path)
    )
    image = random_image(0, **PROMPT_IMAGE)
    out = rollout.generate_sequences(vl_prompts(processor, model_path, [VLSample("Describe it.", [image])]))
    assert len(llm.seen) == 1 and out.meta_info["metrics"]["rollout/multi_turn/truncated"] == 1
    # the tool tokens stop right before the picture's pads; the row keeps its prompt picture only
    assert out.batch["responses"][0, : len(call) + before_pad].tolist() == call + tool[:before_pad]
    assert out.batch["attention_mask"][0, -budget:].tolist() == [1] * (len(call) + before_pad) + [0, 0]
    assert out.non_tensor_batch["multi_modal_data"][0] == {"images": [image]}


# ----------------------------------------------------------------------------------------------------------------------
# the real engine in the FSDP worker
# ----------------------------------------------------------------------------------------------------------------------
# every model turn calls `look` (a random model never writes a call itself); the engine, template and tool are real
ENGINE_TOOLS = LOOK_TOOLS.replace(
    "TOOLS = [look]",
    """from easyrl.workers.rollout.multi_turn import ToolCall, register_tool_call_parser


@register_tool_call_parser("always_look")
def always_look(text):
    return [ToolCall("look", {"corner": "top left"})]


TOOLS = [look]""",
)
ENGINE_RESPONSE_LENGTH = 96


@contextlib.contextmanager
def vl_worker(family: str, folder: Path, multi_turn: MultiTurnConfig, prompt_length: int = 48):
    """(worker group, model folder) of a tiny random VLM of ``family`` whose engine rolls out with ``multi_turn``."""
    from easyrl.testing.tiny_vlms import build_tiny_vlm
    from easyrl.workers.fsdp_worker import FSDPWorker
    from tests.fsdp_helpers import worker_group
    from tests.rollout_helpers import rollout_worker_config

    model_path = build_tiny_vlm(family, folder)
    config = rollout_worker_config(model_path, 1)
    rollout = config.rollout
    rollout.prompt_length = prompt_length
    rollout.response_length = ENGINE_RESPONSE_LENGTH
    rollout.max_model_len = rollout.prompt_length + rollout.response_length
    rollout.multi_turn = multi_turn
    with worker_group(
        FSDPWorker, config, "actor_rollout", name_prefix="multiturnvl", process_group_timeout_s=240
    ) as group:
        group.init_model()
        yield group, model_path


@pytest.fixture(scope="module", params=["qwen2_5_vl", "qwen3_vl"])
def vl_multi_turn_worker(request, ray_cluster, tmp_path_factory):
    """(worker group, model folder) of a tiny random VLM of each family, with the look tool."""
    tools_file = tmp_path_factory.mktemp("vl_tools") / "look_tools.py"
    tools_file.write_text(ENGINE_TOOLS)
    multi_turn = MultiTurnConfig(
        tools=str(tools_file), max_turns=2, turn_max_tokens=6, tool_timeout=10, parser="always_look"
    )
    with vl_worker(request.param, tmp_path_factory.mktemp(request.param), multi_turn) as worker:
        yield worker


@pytest.mark.slow  # ~140 s, mostly starting Ray and the engine; the scripted tests above run by default
@pytest.mark.timeout(400)
def test_engine_tool_pictures_flow_into_the_actor_whose_log_probs_match_vllm(vl_multi_turn_worker):
    from easyrl.data.tokenizer import load_tokenizer_and_processor
    from easyrl.workers.rollout.base import GenerationRequest

    worker, model_path = vl_multi_turn_worker
    tokenizer, processor = load_tokenizer_and_processor(str(model_path))
    samples = [VLSample("Describe it.", [random_image(seed, **PROMPT_IMAGE)]) for seed in range(2)]
    prompts = vl_prompts(processor, model_path, samples)
    out = worker.generate_sequences(prompts, GenerationRequest(sampling_override={"n": 2}, seed=3))
    batch = out.batch
    pad = processor.image_token_id
    for row in range(len(out)):
        length = int(batch["attention_mask"][row, -ENGINE_RESPONSE_LENGTH:].sum())
        mask = batch["response_mask"][row, :length].tolist()
        tokens = batch["responses"][row, :length].tolist()
        model_runs = [(s, e) for v, s, e in _runs(mask) if v == 1]
        tool_runs = [(s, e) for v, s, e in _runs(mask) if v == 0]
        # 2 turns of at most 6 tokens with the tool message between them: its pads are the crop's 4 vision tokens
        # (56 x 56 pixels: 2 x 2 tokens of 28 pixels for Qwen2.5-VL; sized to 64 x 64, 2 x 2 of 32, for Qwen3-VL)
        assert len(model_runs) == 2 and all(e - s <= 6 for s, e in model_runs) and len(tool_runs) == 1
        s, e = tool_runs[0]
        assert tokens[s:e].count(pad) == CROP_TOKENS
        assert tokenizer.decode(tokens[s:e]).endswith("<|vision_end|><|im_end|>\n<|im_start|>assistant\n")
        media = out.non_tensor_batch["multi_modal_data"][row]
        assert len(media["images"]) == 2 and media["images"][1].size in {(56, 56), (64, 64)}
        assert media["images"][0] is not media["images"][1]
    metrics = out.meta_info["metrics"]
    assert metrics["rollout/multi_turn/tool_calls"] == 4 and metrics["rollout/multi_turn/tool_errors"] == 0
    # the actor scores prompt + both turns + the tool message with both pictures: vLLM's log-probs on model tokens
    actor = worker.compute_log_probs(out).batch["old_log_probs"]
    mismatch = rollout_logprob_mismatch(actor, batch["rollout_log_probs"], batch["response_mask"])
    print(f"multi-turn VL rollout vs actor log-prob |diff|: {mismatch}")
    assert mismatch["rollout/logprob_abs_diff/max"] < LOGPROB_TOLERANCE


def test_pictures_past_limit_images_or_to_a_text_model_answer_the_model_with_a_counted_error(
    vl_tokenizer_and_processor, look_tools, tokenizer
):
    vl_tokenizer, processor = vl_tokenizer_and_processor
    model_path = Path(processor.tokenizer.name_or_path)
    call = vl_tokenizer.encode(CALL + CALL, add_special_tokens=False) + [vl_tokenizer.eos_token_id]  # two zooms
    engine, _ = scripted_engine(vl_tokenizer, {0: [call, call]}, response_length=128)
    engine.config.limit_images = 2  # the prompt's picture and one more
    rollout = MultiTurnRollout(
        engine, MultiTurnConfig(tools=look_tools, max_turns=2), processor=processor, model_path=str(model_path)
    )
    image = random_image(0, **PROMPT_IMAGE)
    out = rollout.generate_sequences(vl_prompts(processor, model_path, [VLSample("Describe it.", [image])]))
    assert out.meta_info["metrics"]["rollout/multi_turn/tool_errors"] == 1
    first, second = out.non_tensor_batch["messages"][0][1:3]
    assert first["content"] == [{"type": "text", "text": "Here:"}, {"type": "image"}]
    assert second["content"] == (
        "Error: tool 'look' returned 1 picture(s), but the trajectory already holds 2 and worker.rollout.limit_images "
        "is 2; raise it to allow more pictures per trajectory."
    )
    assert len(out.non_tensor_batch["multi_modal_data"][0]["images"]) == 2

    # a text model (no processor): the picture cannot be shown, the model is told so
    text_call = tokenizer.encode(CALL, add_special_tokens=False) + [tokenizer.eos_token_id]
    engine, _ = scripted_engine(tokenizer, {0: [text_call, text_call]}, response_length=128)
    rollout = MultiTurnRollout(engine, MultiTurnConfig(tools=look_tools, max_turns=2))
    prompts = vl_prompts(processor, model_path, [VLSample("Describe it.", [image])])
    out = rollout.generate_sequences(prompts)
    assert out.meta_info["metrics"]["rollout/multi_turn/tool_errors"] == 1
    assert out.non_tensor_batch["messages"][0][1]["content"].startswith(
        "Error: tool 'look' returned 1 picture(s), but the model has no multimodal processor to read them"
    )


def test_a_tools_pictures_a_text_model_cannot_read_are_logged_once_per_tool(
    vl_tokenizer_and_processor, look_tools, tokenizer, caplog
):
    """Logged at every call (hundreds of lines a step at a real batch size), then once more as the first error."""
    vl_tokenizer, processor = vl_tokenizer_and_processor
    model_path = Path(processor.tokenizer.name_or_path)
    text_call = tokenizer.encode(CALL, add_special_tokens=False) + [tokenizer.eos_token_id]
    engine, _ = scripted_engine(tokenizer, {i: [text_call, text_call] for i in range(3)}, response_length=128)
    rollout = MultiTurnRollout(engine, MultiTurnConfig(tools=look_tools, max_turns=2))
    image = random_image(0, **PROMPT_IMAGE)
    prompts = vl_prompts(processor, model_path, [VLSample(f"Describe it {i}.", [image]) for i in range(3)])
    with caplog.at_level("WARNING"):
        out = rollout.generate_sequences(prompts)
    assert out.meta_info["metrics"]["rollout/multi_turn/tool_errors"] == 3
    said = [r.getMessage() for r in caplog.records if "no multimodal processor" in r.getMessage()]
    assert len(said) == 1 and said[0].startswith("Tool 'look': the model read")


# ----------------------------------------------------------------------------------------------------------------------
# a run: GRPO through `easyrl train` with pictures in the observations
# ----------------------------------------------------------------------------------------------------------------------
# A random model never writes a tool call, so the run's pictures come from an environment: each step shows the top
# left quarter of the row's picture, enlarged (what tools/image_zoom.py's zoom returns for "top left").
ZOOM_ENV = """
class ZoomEnv:
    def reset(self, row):
        self.picture = row["multi_modal_data"]["images"][0]

    def step(self, action_text):
        width, height = self.picture.size
        part = self.picture.crop((0, 0, width // 2, height // 2)).resize((width, height))
        return ["A closer look:", part], 0.0, False
"""


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_two_grpo_steps_with_pictures_in_the_observations(tmp_path):
    """The CPU zoom recipe (tiny random Qwen2.5-VL, shapes) with the environment above, 4 prompts x 4 samples, 2
    steps: the pictures go through the trainer's batch into the actor's forward and update."""
    from tests.fixtures.trainer_runs import REPO_ROOT, bare_run, train_for_metrics

    env_path = tmp_path / "zoom_env.py"
    env_path.write_text(ZOOM_ENV)
    args = [
        f"config={REPO_ROOT / 'examples' / 'shapes_tiny_vl_grpo_tools.yaml'}",
        "worker.rollout.multi_turn.tools=",
        f"worker.rollout.multi_turn.env={env_path}:ZoomEnv",
        "worker.rollout.multi_turn.max_turns=2",
        "worker.reward.num_cpus=0",
        # the random model's samples all score 0: the skip would leave no sample whose log-probs the update measures
        "worker.actor.skip_zero_advantage=false",
        *bare_run(2, tmp_path / "checkpoints"),
    ]
    metrics = train_for_metrics(args, tmp_path, 2)
    for step in (1, 2):
        row = metrics[step]
        print(step, {key: value for key, value in row.items() if "multi_turn" in key or "logprob" in key})
        assert row["rollout/multi_turn/env_errors"] == 0 and row["rollout/multi_turn/turns/mean"] == 2
        assert np.isfinite(row["actor/pg_loss"]) and np.isfinite(row["actor/grad_norm"])
        assert row["rollout/logprob_abs_diff/mean"] < LOGPROB_TOLERANCE  # the actor saw the pictures vLLM saw


# A tool environment (TRL's environment_factory class) on a VLM: reset keeps the row's picture (`images`) and adds a
# sentence to the prompt's last user message; its `look` method shows a crop of that picture.
LOOK_ENV = '''
class LookEnv:
    def reset(self, images, **kwargs):
        self.picture, self.looks = images[0], 0
        return " Look closely."

    def get_reward(self) -> float:
        return float(self.looks)

    def look(self, corner: str) -> list:
        """Look at a corner of the picture.

        Args:
            corner: Which corner, e.g. "top left".
        """
        self.looks += 1
        return ["Here:", self.picture.crop((0, 0, 56, 56))]
'''


def env_rollout(tokenizer_and_processor, folder: Path, source: str, class_name: str, turns: list):
    """(rollout, scripted llm) of one trajectory of the tool environment ``source`` on the tiny VLM's processor."""
    tokenizer, processor = tokenizer_and_processor
    (folder / "env.py").write_text(source)
    engine, llm = scripted_engine(tokenizer, {0: turns}, response_length=64)
    config = MultiTurnConfig(env=f"{folder / 'env.py'}:{class_name}", max_turns=3)
    model_path = processor.tokenizer.name_or_path
    return MultiTurnRollout(engine, config, processor=processor, model_path=str(model_path)), llm


def test_a_tool_environment_grows_a_picture_prompt_and_its_method_shows_a_crop(vl_tokenizer_and_processor, tmp_path):
    """The grown prompt (picture, text, reset's sentence) is what vLLM reads and what the actor scores: its ids, and
    3-D rope positions that are the model's own over the whole sequence with the prompt's picture and the crop."""
    tokenizer, processor = vl_tokenizer_and_processor
    model_path = Path(processor.tokenizer.name_or_path)
    eos, pad = tokenizer.eos_token_id, processor.image_token_id
    encode = lambda text: tokenizer.encode(text, add_special_tokens=False)  # noqa: E731
    call, answer = encode(CALL) + [eos], encode("A red square.") + [eos]
    rollout, llm = env_rollout(vl_tokenizer_and_processor, tmp_path, LOOK_ENV, "LookEnv", [call, answer])
    image = random_image(0, **PROMPT_IMAGE)
    prompts = vl_prompts(processor, model_path, [VLSample("Describe it.", [image])])
    width = prompts.batch["input_ids"].shape[-1] + 8
    widened(prompts, 8, tokenizer.pad_token_id)  # room for the sentence
    out = rollout.generate_sequences(prompts)

    messages = [
        {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Describe it. Look closely."}]}
    ]
    grown = encode(processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False))
    assert llm.seen[0] == [grown] and llm.seen[1] == [grown + call + encode(TOOL_TEXT)]
    assert out.non_tensor_batch["env_get_reward"].tolist() == [1.0]
    crop = out.non_tensor_batch["multi_modal_data"][0]["images"][1]
    assert np.array_equal(np.asarray(crop), np.asarray(image)[:56, :56])
    # the actor's prompt: the grown one with the picture's pad expanded; positions the model's own throughout
    attended = out.batch["attention_mask"][0].bool()
    ids = out.batch["input_ids"][0][attended]
    expanded = [token for t in grown for token in ([pad] * 6 if t == pad else [t])]
    assert ids[: len(expanded)].tolist() == expanded and int(attended[:width].sum()) == len(expanded)
    grids = processor.image_processor(images=[image, crop], return_tensors="pt")["image_grid_thw"]
    positions_of = make_position_id_fn(processor, model_path=str(model_path))
    expected = positions_of({"input_ids": ids, "image_grid_thw": grids})
    assert torch.equal(out.batch["position_ids"][0][:, attended], expected)


# A tool environment whose reset shows a picture of its own (a GUI's first screenshot, a generated diagram): it joins
# the prompt's last user message after the row's picture, as TRL adds a reset's content parts there.
SHOW_ENV = "from easyrl.testing.vl_batch import random_image\n" + LOOK_ENV.replace(
    "class LookEnv:", "class ShowEnv:"
).replace("def reset(self, images, **kwargs)", "def reset(self, **kwargs)").replace(
    'self.picture, self.looks = images[0], 0\n        return " Look closely."',
    "self.picture, self.looks = random_image(2, width=56, height=56), 0\n"
    '        return [" Compare with:", {"type": "image", "image": random_image(1, width=56, height=56)}]',
)


def test_a_reset_picture_joins_the_prompt_after_the_rows_with_the_models_own_rope(
    vl_tokenizer_and_processor, tmp_path, tokenizer
):
    """vLLM reads the grown prompt with one pad per picture and the reset's picture after the row's; the actor reads it
    with the pads expanded, the pictures in the same order, and 3-D rope positions that are the model's own over the
    whole sequence (prompt picture, reset picture, tool picture)."""
    vl_tokenizer, processor = vl_tokenizer_and_processor
    model_path = Path(processor.tokenizer.name_or_path)
    eos, pad = vl_tokenizer.eos_token_id, processor.image_token_id
    encode = lambda text: vl_tokenizer.encode(text, add_special_tokens=False)  # noqa: E731
    call, answer = encode(CALL) + [eos], encode("The same.") + [eos]
    rollout, llm = env_rollout(vl_tokenizer_and_processor, tmp_path, SHOW_ENV, "ShowEnv", [call, answer])
    seen_media = record_media(llm)
    image = random_image(0, **PROMPT_IMAGE)
    prompts = vl_prompts(processor, model_path, [VLSample("Describe it.", [image])])
    width = prompts.batch["input_ids"].shape[-1] + 16
    widened(prompts, 16, vl_tokenizer.pad_token_id)  # room for the reset
    out = rollout.generate_sequences(prompts)

    content = [{"type": "image"}, {"type": "text", "text": "Describe it."}, {"type": "text", "text": " Compare with:"}]
    messages = [{"role": "user", "content": [*content, {"type": "image"}]}]
    grown = encode(processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False))
    assert grown.count(pad) == 2
    assert llm.seen[0] == [grown] and llm.seen[1] == [grown + call + encode(TOOL_TEXT)]
    shown = random_image(1, width=56, height=56)
    first_turn, second_turn = seen_media[0][0]["image"], seen_media[1][0]["image"]
    assert len(first_turn) == 2 and first_turn[0] is image and np.array_equal(first_turn[1], shown)
    assert len(second_turn) == 3 and np.array_equal(second_turn[2], random_image(2, width=56, height=56))
    media = out.non_tensor_batch["multi_modal_data"][0]["images"]
    assert media[0] is image and [np.asarray(p).tolist() for p in media[1:]] == [
        np.asarray(shown).tolist(),
        np.asarray(random_image(2, width=56, height=56)).tolist(),
    ]
    assert out.non_tensor_batch["raw_prompt_ids"][0] == grown
    assert prompts.non_tensor_batch["multi_modal_data"][0] == {"images": [image]}  # the row is untouched
    assert out.non_tensor_batch["env_get_reward"].tolist() == [1.0]
    # the actor's prompt: the grown one, each pad expanded (6 vision tokens for the row's, 4 for the reset's)
    attended = out.batch["attention_mask"][0].bool()
    ids = out.batch["input_ids"][0][attended]
    sizes = iter([6, CROP_TOKENS])
    expanded = [token for t in grown for token in ([pad] * next(sizes) if t == pad else [t])]
    assert ids[: len(expanded)].tolist() == expanded and int(attended[:width].sum()) == len(expanded)
    grids = processor.image_processor(images=[image, shown, shown], return_tensors="pt")["image_grid_thw"]
    positions_of = make_position_id_fn(processor, model_path=str(model_path))
    expected = positions_of({"input_ids": ids, "image_grid_thw": grids})
    assert torch.equal(out.batch["position_ids"][0][:, attended], expected)
    vision = build_vision_inputs(
        out.batch["input_ids"], out.batch["attention_mask"], out.non_tensor_batch["multi_modal_data"], processor, 64
    )
    assert vision.image_grid_thw.tolist() == [[1, 6, 4], [1, 4, 4], [1, 4, 4]]

    # a text model cannot see it: the reset is an environment error, counted, and the prompt stays as it was
    engine, llm = scripted_engine(tokenizer, {0: [[tokenizer.eos_token_id]]}, response_length=16)
    rollout = MultiTurnRollout(engine, MultiTurnConfig(env=f"{tmp_path / 'env.py'}:ShowEnv", max_turns=3))
    text_prompts = chat_prompts(tokenizer, ["Describe it."], [{}])
    out = rollout.generate_sequences(text_prompts)
    assert out.meta_info["metrics"]["rollout/multi_turn/env_errors"] == 1
    assert llm.seen[0] == [list(text_prompts.non_tensor_batch["raw_prompt_ids"][0])]
    assert "reset: it returned 1 picture(s), but the model has no multimodal processor" in str(
        out.non_tensor_batch["messages"][0]
    )


# the same environment in the engine: every model turn calls `look` (a random model never writes a call itself)
ENGINE_SHOW_ENV = (
    SHOW_ENV
    + """

from easyrl.workers.rollout.multi_turn import ToolCall, register_tool_call_parser


@register_tool_call_parser("always_look_env")
def always_look_env(text):
    return [ToolCall("look", {"corner": "top left"})]
"""
)
RESET_PROMPT_WIDTH = 64  # the row's picture and text, and the reset's text and picture


@pytest.mark.slow  # ~150 s per family, mostly starting Ray and the engine
@pytest.mark.timeout(600)
@pytest.mark.parametrize("family", ["qwen2_5_vl", "qwen3_vl"])
def test_engine_reset_pictures_reach_the_actor_whose_log_probs_match_vllm(family, ray_cluster, tmp_path):
    from easyrl.data.tokenizer import load_tokenizer_and_processor
    from easyrl.workers.rollout.base import GenerationRequest

    (tmp_path / "show_env.py").write_text(ENGINE_SHOW_ENV)
    multi_turn = MultiTurnConfig(
        env=f"{tmp_path / 'show_env.py'}:ShowEnv",
        max_turns=2,
        turn_max_tokens=6,
        tool_timeout=10,
        parser="always_look_env",
    )
    with vl_worker(family, tmp_path / family, multi_turn, RESET_PROMPT_WIDTH) as (worker, model_path):
        tokenizer, processor = load_tokenizer_and_processor(str(model_path))
        samples = [VLSample("Describe it.", [random_image(seed, **PROMPT_IMAGE)]) for seed in range(2)]
        prompts = vl_prompts(processor, model_path, samples)
        widened(prompts, RESET_PROMPT_WIDTH - prompts.batch["input_ids"].shape[-1], tokenizer.pad_token_id)
        out = worker.generate_sequences(prompts, GenerationRequest(sampling_override={"n": 2}, seed=3))
        metrics = out.meta_info["metrics"]
        assert metrics["rollout/multi_turn/env_errors"] == 0 and metrics["rollout/multi_turn/reset_differs"] == 0
        assert metrics["rollout/multi_turn/tool_calls"] == 4
        pad = processor.image_token_id
        for row in range(len(out)):
            prompt = out.batch["prompts"][row][out.batch["attention_mask"][row, :RESET_PROMPT_WIDTH].bool()].tolist()
            assert " Compare with:" in tokenizer.decode(prompt)
            media = out.non_tensor_batch["multi_modal_data"][row]["images"]
            # the row's picture, the reset's, the tool's: the prompt holds the pads of the first two
            assert len(media) == 3 and prompt.count(pad) == 6 + CROP_TOKENS, (family, prompt.count(pad))
        actor = worker.compute_log_probs(out).batch["old_log_probs"]
        batch = out.batch
        mismatch = rollout_logprob_mismatch(actor, batch["rollout_log_probs"], batch["response_mask"])
        print(f"{family}: reset pictures, rollout vs actor log-prob |diff|: {mismatch}")
        assert mismatch["rollout/logprob_abs_diff/max"] < LOGPROB_TOLERANCE


FINAL_PICTURE_ENV = """
class FinalPictureEnv:
    def reset(self, row):
        self.picture, self.turn = row["multi_modal_data"]["images"][0], 0

    def step(self, action_text):
        self.turn += 1
        # every observation shows the picture; the first ends the episode for `done` rows
        return ["Again:", self.picture], 1.0, self.done_at == self.turn
"""


def test_a_last_observations_pictures_are_never_shown_nor_counted_against_limit_images(
    vl_tokenizer_and_processor, tmp_path, caplog
):
    """The observation of a done step, or of the last turn, never reaches the model: its pictures must not count
    against worker.rollout.limit_images (they made an environment error that zeroed the trajectory's reward)."""
    import logging

    vl_tokenizer, processor = vl_tokenizer_and_processor
    model_path = Path(processor.tokenizer.name_or_path)
    answer = vl_tokenizer.encode("Done.", add_special_tokens=False) + [vl_tokenizer.eos_token_id]
    image = random_image(0, **PROMPT_IMAGE)
    for done_at, max_turns, env_errors in [(1, 3, 0), (99, 1, 0), (99, 2, 1)]:
        env_file = tmp_path / f"env_{done_at}_{max_turns}.py"  # a module per case: a loaded one is kept
        env_file.write_text(FINAL_PICTURE_ENV.replace("self.done_at", str(done_at)))
        engine, _ = scripted_engine(vl_tokenizer, {0: [answer] * max_turns}, response_length=64)
        engine.config.limit_images = 1  # the prompt's picture only
        rollout = MultiTurnRollout(
            engine,
            MultiTurnConfig(env=f"{env_file}:FinalPictureEnv", max_turns=max_turns),
            processor=processor,
            model_path=str(model_path),
        )
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="easyrl.workers.rollout.multi_turn"):
            out = rollout.generate_sequences(vl_prompts(processor, model_path, [VLSample("Describe it.", [image])]))
        metrics = out.meta_info["metrics"]
        assert metrics["rollout/multi_turn/env_errors"] == env_errors, (done_at, max_turns)
        assert len(out.non_tensor_batch["multi_modal_data"][0]["images"]) == 1
        if env_errors:  # a second turn would show the picture: past the limit, said once, without a doubled stop
            assert out.non_tensor_batch["env_reward"].tolist() == [0.0]
            (warning,) = [r.getMessage() for r in caplog.records]
            assert "worker.rollout.limit_images is 1; raise it to allow more pictures per trajectory; the" in warning
        else:  # the last observation's reward counts, its picture is never prepared
            assert out.non_tensor_batch["env_reward"].tolist() == [1.0] and not caplog.records
