"""`easyrl sft`: the loss mask (token by token, text and with a picture), the batch layout, and a real run on two
FSDP2 workers whose loss falls and whose output folder is an RL actor's model_path."""

import json
import os
import re
import signal
import subprocess
import sys

import numpy as np
import pytest
import torch
import yaml

from easyrl.config.schema import DataConfig, SFTConfig
from easyrl.data.collate import sft_collate
from easyrl.data.dataset import UnusableRowError
from easyrl.data.sft import ConversationEncoder, UnusableConversationError, labelled_pieces
from tests.fixtures.trainer_runs import (
    REPO_ROOT,
    kill_process_group,
    launch_training,
    log_tail,
    metrics_by_step,
    run_training,
    wait_for_path,
    wait_until,
)


CONVERSATION = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "2+2?"},
    {"role": "assistant", "content": "4"},
    {"role": "user", "content": "and 3+3?"},
    {"role": "assistant", "content": "6"},
]


def labelled(encoder, item) -> list[tuple[int, str]]:
    ids, mask = item["input_ids"].tolist(), item["loss_mask"].tolist()
    return [(i, encoder.tokenizer.decode([t])) for i, (t, m) in enumerate(zip(ids, mask)) if m]


# ----------------------------------------------------------------------------------------------------------------------
# the loss mask
# ----------------------------------------------------------------------------------------------------------------------
def test_only_the_assistant_replies_and_their_end_of_turn_tokens_are_labelled(tokenizer):
    encoder = ConversationEncoder(tokenizer, None, DataConfig(), SFTConfig(), "data.train_files")
    item = encoder.encode({"messages": CONVERSATION})
    # ChatML: <|im_start|>system\nBe brief.<|im_end|>\n (8 tokens) <|im_start|>user\n2+2?<|im_end|>\n (9)
    # <|im_start|>assistant\n (4) | 4<|im_end|> | \n <|im_start|>user\nand 3+3?<|im_end|>\n (11)
    # <|im_start|>assistant\n (4) | 6<|im_end|> | \n
    assert len(item["input_ids"]) == 42
    assert labelled(encoder, item) == [(21, "4"), (22, "<|im_end|>"), (39, "6"), (40, "<|im_end|>")]
    # the tokens are the rendered conversation's, and the text before each reply is the generation prompt
    assert tokenizer.decode(item["input_ids"]) == encoder.render(CONVERSATION, False)
    assert tokenizer.decode(item["input_ids"][:21]) == encoder.render(CONVERSATION[:2], True)
    assert item["position_ids"].tolist() == list(range(42))


def test_prompt_and_response_columns_make_one_exchange_through_the_prompt_template(tokenizer, tmp_path):
    template = tmp_path / "boxed.jinja"
    template.write_text("{{ content }} Put the answer in \\boxed{}.")
    data = DataConfig(prompt_key="problem", format_prompt=str(template))
    encoder = ConversationEncoder(tokenizer, None, data, SFTConfig(response_key="solution"), "data.train_files")
    item = encoder.encode({"problem": "1+1?", "solution": "\\boxed{2}"})
    reply = [text for _, text in labelled(encoder, item)]
    assert "".join(reply) == "\\boxed{2}<|im_end|>"
    prompt = encoder.render([{"role": "user", "content": "1+1? Put the answer in \\boxed{}."}], True)
    assert tokenizer.decode(item["input_ids"][: labelled(encoder, item)[0][0]]) == prompt


def test_chat_message_prompt_and_completion_columns_keep_their_turns(tokenizer):
    # TRL's conversational prompt-completion rows: both columns hold chat messages
    data = DataConfig(prompt_key="prompt")
    encoder = ConversationEncoder(tokenizer, None, data, SFTConfig(response_key="completion"), "data.train_files")
    prompt = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "1+1?"}]
    item = encoder.encode({"prompt": prompt, "completion": [{"role": "assistant", "content": "2"}]})
    assert "".join(text for _, text in labelled(encoder, item)) == "2<|im_end|>"
    assert tokenizer.decode(item["input_ids"][: labelled(encoder, item)[0][0]]) == encoder.render(prompt, True)
    with pytest.raises(UnusableConversationError, match=r"data.prompt_key='prompt': the prompt is a list, so it must"):
        encoder.encode({"prompt": ["1+1?"], "completion": "2"})


def test_a_picture_takes_its_pads_in_the_prompt_and_the_labels_stay_on_the_replies(tmp_path):
    from PIL import Image
    from transformers import AutoConfig

    from easyrl.data.tokenizer import load_tokenizer_and_processor
    from easyrl.testing.tiny_vl import build_tiny_qwen2_5_vl

    path = build_tiny_qwen2_5_vl(tmp_path / "vl")
    tokenizer, processor = load_tokenizer_and_processor(str(path))
    data = DataConfig(min_pixels=28 * 28, max_pixels=56 * 56)
    encoder = ConversationEncoder(
        tokenizer, processor, data, SFTConfig(), "data.train_files", model_config=AutoConfig.from_pretrained(path)
    )
    messages = [
        {"role": "user", "content": "<image>How many?"},
        {"role": "assistant", "content": "2"},
        {"role": "user", "content": "Sure?"},
        {"role": "assistant", "content": "yes"},
    ]
    item = encoder.encode({"messages": messages, "images": [Image.new("RGB", (56, 56), (255, 0, 0))]})
    ids = item["input_ids"]
    # system (11 tokens) + <|im_start|>user\n (3) + <|vision_start|> + 4 pads (56x56 px: 2x2 merged patches) + ...
    assert int((ids == processor.image_token_id).sum()) == 4
    assert torch.nonzero(ids == processor.image_token_id).flatten().tolist() == [15, 16, 17, 18]
    assert labelled(encoder, item) == [(29, "2"), (30, "<|im_end|>"), (43, "yes"), (44, "<|im_end|>")]
    assert len(ids) == 46
    # 3-D rope: the 2x2 picture advances the text positions by 2, not 4 -> the last token sits at 46 - 4 + 2 - 1
    assert item["position_ids"].shape == (3, 46)
    assert item["position_ids"][:, -1].tolist() == [43, 43, 43]
    assert len(item["multi_modal_data"]["images"]) == 1
    # the same conversation in Qwen's / OpenAI's format: the picture named inside the message, no image column
    Image.new("RGB", (56, 56), (255, 0, 0)).save(tmp_path / "red.png")
    for part in (
        {"type": "image", "image": str(tmp_path / "red.png")},
        {"type": "image_url", "image_url": {"url": str(tmp_path / "red.png")}},
    ):
        named = [{"role": "user", "content": [part, {"type": "text", "text": "How many?"}]}, *messages[1:]]
        same = encoder.encode({"messages": named})
        assert torch.equal(same["input_ids"], ids) and torch.equal(same["loss_mask"], item["loss_mask"])
        assert np.array_equal(
            np.asarray(same["multi_modal_data"]["images"][0]), np.asarray(item["multi_modal_data"]["images"][0])
        )
    with pytest.raises(UnusableRowError, match=r"name their own pictures/videos and the row also has some"):
        encoder.encode({"messages": named, "images": [Image.new("RGB", (56, 56))]})


def test_a_video_and_a_picture_in_two_turns_are_tokenized_and_placed_as_in_one_processor_call(tmp_path):
    """Each turn is tokenized on its own with the media whose pads it holds: the ids, grids and 3-D rope positions
    equal those of the whole conversation in one processor call, the video is the dataset's sampled frames (what the
    actor encodes), and a video named inside its message part is read like one in the video column."""
    from PIL import Image
    from transformers import AutoConfig

    from easyrl.data.dataset import video_kwargs
    from easyrl.data.rope import make_position_id_fn
    from easyrl.data.tokenizer import load_tokenizer_and_processor
    from easyrl.testing.tiny_vl import build_tiny_qwen2_5_vl

    path = build_tiny_qwen2_5_vl(tmp_path / "vl")
    tokenizer, processor = load_tokenizer_and_processor(str(path))
    model_config = AutoConfig.from_pretrained(path)
    data = DataConfig(min_pixels=28 * 28, max_pixels=56 * 56, video_fps=2.0)
    encoder = ConversationEncoder(
        tokenizer, processor, data, SFTConfig(), "data.train_files", (str(tmp_path),), model_config=model_config
    )
    for i in range(4):
        Image.new("RGB", (56, 56), (60 * i, 0, 0)).save(tmp_path / f"f{i}.png")
    Image.new("RGB", (56, 28), (0, 0, 255)).save(tmp_path / "blue.png")
    frames = [f"f{i}.png" for i in range(4)]
    messages = [
        {"role": "user", "content": "<video>What moves?"},
        {"role": "assistant", "content": "red"},
        {"role": "user", "content": "And here? <image>"},
        {"role": "assistant", "content": "blue"},
    ]
    item = encoder.encode({"messages": messages, "videos": [frames], "images": ["blue.png"]})
    ids = item["input_ids"]
    video_pad, image_pad = processor.video_token_id, processor.image_token_id
    # 4 frames / temporal patch 2 = 2 steps x 2x2 merged tokens; the 56x28 picture: 2x1
    assert (int((ids == video_pad).sum()), int((ids == image_pad).sum())) == (8, 2)
    assert [text for _, text in labelled(encoder, item)] == ["red", "<|im_end|>", "blue", "<|im_end|>"]
    assert int(torch.nonzero(ids == video_pad).max()) < int(torch.nonzero(ids == image_pad).min())
    media = item["multi_modal_data"]
    assert media["videos"][0].shape == (4, 3, 56, 56) and media["video_fps"] == [2.0]
    assert [image.size for image in media["images"]] == [(56, 28)]

    whole_text = encoder.render(encoder.messages({"messages": messages}, 1, 1), False)
    whole = processor(
        text=[whole_text], images=media["images"], videos=media["videos"], add_special_tokens=False,
        return_tensors="pt", **video_kwargs(media["videos"], media["video_fps"]),
    )  # fmt: skip
    assert torch.equal(ids, whole["input_ids"][0])
    expected = make_position_id_fn(processor, model_config)(dict(whole))
    assert torch.equal(item["position_ids"], expected)
    # the video's two time steps are tokens_per_second * temporal_patch / fps = 2 positions apart
    assert item["position_ids"][0, ids == video_pad].unique().diff().tolist() == [2]

    video_part = {"type": "video", "video": frames}
    picture_part = {"type": "image_url", "image_url": {"url": "blue.png"}}
    named = [
        {"role": "user", "content": [video_part, {"type": "text", "text": "What moves?"}]},
        messages[1],
        {"role": "user", "content": [{"type": "text", "text": "And here? "}, picture_part]},
        messages[3],
    ]
    same = encoder.encode({"messages": named})
    assert torch.equal(same["input_ids"], ids) and torch.equal(same["position_ids"], item["position_ids"])
    assert torch.equal(same["multi_modal_data"]["videos"][0], media["videos"][0])
    # a video place without a video, a video in a reply: skipped with the reason
    with pytest.raises(
        UnusableConversationError, match="1 <image> and 1 <video> placeholders but the row has 1 images and 0"
    ):
        encoder.encode({"messages": messages, "images": ["blue.png"]})
    reply_video = [messages[0], {"role": "assistant", "content": "<video>"}]
    with pytest.raises(UnusableConversationError, match="an assistant message holds an image or video"):
        encoder.encode({"messages": reply_video, "videos": [frames, frames]})
    # said so though the places outnumber the pictures (it read as a miscount)
    reply_picture = [{"role": "user", "content": "<image> What?"}, {"role": "assistant", "content": "See <image>"}]
    with pytest.raises(UnusableConversationError, match="an assistant message holds an image or video"):
        encoder.encode({"messages": reply_picture, "images": ["blue.png"]})


def test_a_template_that_rewrites_earlier_turns_is_refused_with_the_key_to_change():
    def render(messages, add_generation_prompt):  # drops earlier replies once a later turn follows
        shown = [m for i, m in enumerate(messages) if m["role"] != "assistant" or i == len(messages) - 1]
        return "".join(f"[{m['role']}]{m['content']}" for m in shown) + (
            "[assistant]" if add_generation_prompt else ""
        )

    with pytest.raises(UnusableConversationError, match="data.override_chat_template"):
        labelled_pieces(CONVERSATION, render)
    with pytest.raises(UnusableConversationError, match="no assistant message"):
        labelled_pieces(CONVERSATION[:2], render)


def test_collate_puts_each_first_labelled_token_at_the_response_start():
    items = [
        {
            "input_ids": torch.tensor([5, 6, 7, 8]),
            "loss_mask": torch.tensor([0, 0, 1, 1]),
            "position_ids": torch.arange(4),
        },
        {
            "input_ids": torch.tensor([9, 10, 11]),
            "loss_mask": torch.tensor([0, 1, 0]),
            "position_ids": torch.arange(3),
        },
    ]
    batch = sft_collate(items, pad_token_id=0).batch
    assert batch["input_ids"].tolist() == [[5, 6, 7, 8], [0, 9, 10, 11]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1, 1], [0, 1, 1, 1]]
    assert batch["position_ids"].tolist() == [[0, 1, 2, 3], [0, 0, 1, 2]]
    assert batch["responses"].tolist() == [[7, 8], [10, 11]]
    assert batch["response_mask"].tolist() == [[1, 1], [1, 0]]


def test_unusable_and_overlong_rows_are_skipped_counted_and_named(tokenizer, tmp_path, caplog):
    from easyrl.data.sft import SFTDataset

    rows = [
        {"messages": CONVERSATION},
        {"messages": CONVERSATION[:2]},  # no reply
        {"messages": [{"role": "user", "content": "long " * 300}, {"role": "assistant", "content": "ok"}]},
        {"messages": [{"role": "assistant", "content": "hello"}]},  # nothing prompts it
    ]
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    with caplog.at_level("WARNING"):
        dataset = SFTDataset(str(path), tokenizer, None, DataConfig(), SFTConfig(max_length=100))
    assert len(dataset) == 1
    assert [index for index, _ in dataset.unusable_rows] == [1, 3]
    assert dataset.overlong_rows == [2]
    assert "skipped 2 of 4 rows (row 1: the conversation has no assistant message" in caplog.text
    # the lengths of the rows left out say what max_length would keep them
    long_row = re.search(r"longer than sft.max_length=100 tokens \(row 2; (\d+) tokens\)", caplog.text)
    assert long_row and int(long_row[1]) > 300
    with pytest.raises(ValueError, match=r"none of the 4 rows .* within sft.max_length=5 tokens \(the shortest has "):
        SFTDataset(str(path), tokenizer, None, DataConfig(), SFTConfig(max_length=5))
    assert [(record["row"], record["reason"][:22]) for record in dataset.skipped_rows()] == [
        (1, "the conversation has n"),
        (2, "longer than sft.max_le"),
        (3, "the conversation start"),
    ]
    # the rows of a folder of files are named by the file they are in
    (tmp_path / "folder").mkdir()
    (tmp_path / "folder" / "a.jsonl").write_text(json.dumps(rows[0]) + "\n")
    (tmp_path / "folder" / "b.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    caplog.clear()
    with caplog.at_level("WARNING"):
        dataset = SFTDataset(str(tmp_path / "folder"), tokenizer, None, DataConfig(), SFTConfig(max_length=100))
    assert "skipped 2 of 5 rows (b.jsonl row 1: the conversation has no assistant message" in caplog.text
    assert "longer than sft.max_length=100 tokens (b.jsonl row 2; " in caplog.text
    assert [(record["file"], record["row"]) for record in dataset.skipped_rows()] == [
        ("b.jsonl", i) for i in (1, 2, 3)
    ]


def test_typed_text_parts_read_from_a_file_render_as_plain_text(tokenizer, tmp_path):
    from easyrl.data.sft import SFTDataset

    def typed(role, text):
        return {"role": role, "content": [{"type": "text", "text": text}]}

    path = tmp_path / "typed.jsonl"
    path.write_text(json.dumps({"messages": [typed("user", "2+2?"), typed("assistant", "4")]}) + "\n")
    item = SFTDataset(str(path), tokenizer, None, DataConfig(), SFTConfig())[0]
    plain = ConversationEncoder(tokenizer, None, DataConfig(), SFTConfig(), "test").encode(
        {"messages": [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}]}
    )
    assert item["input_ids"].tolist() == plain["input_ids"].tolist()
    assert item["loss_mask"].tolist() == plain["loss_mask"].tolist()


def test_sft_plan_counts_conversations_per_device_and_names_the_keys_it_needs(tiny_model_path, tmp_path):
    from easyrl.config import ConfigError
    from easyrl.config.sft_plan import load_sft_plan

    with pytest.raises(ConfigError, match="`worker.actor.model.model_path`, `data.train_files`"):
        load_sft_plan([])
    with pytest.raises(ConfigError, match="data file `missing.jsonl` does not exist"):
        load_sft_plan([f"worker.actor.model.model_path={tiny_model_path}", "data.train_files=missing.jsonl"])
    rows = tmp_path / "rows.jsonl"
    rows.write_text(json.dumps({"messages": CONVERSATION}) + "\n")
    base = [f"worker.actor.model.model_path={tiny_model_path}", f"data.train_files={rows}"]
    with pytest.raises(ConfigError, match="`data.val_files`: data file `held_out.jsonl` does not exist"):
        load_sft_plan([*base, "data.val_files=held_out.jsonl"])
    # the validation loss reads log-probs at the rollout temperature: SFT fixes it at 1, the training loss's
    assert load_sft_plan([*base, "worker.rollout.temperature=0.7"]).config.worker.rollout.temperature == 1.0
    # a validation-only run writes no model, and its plan said where the model would be
    assert (
        "output: none (trainer.val_only: no training)"
        in load_sft_plan(
            [*base, f"data.val_files={rows}", "trainer.val_only=true", "trainer.n_gpus_per_node=1"]
        ).describe()
    )
    plan = load_sft_plan([*base, "trainer.n_gpus_per_node=2", "worker.actor.global_batch_size=8"])
    assert plan.config.worker.actor.global_batch_size_per_device == 4  # no rollout.n factor in SFT
    assert plan.with_training_steps(5).training_steps == 5 * plan.config.trainer.total_epochs
    with pytest.raises(ConfigError, match=r"over 2 workers .* multiple of 2, or set trainer.n_gpus_per_node to the "
                       r"devices this run has\.$"):  # fmt: skip
        load_sft_plan([*base, "trainer.n_gpus_per_node=2", "worker.actor.global_batch_size=3"])
    # the default 8 workers: a first run on a CPU with a small batch is told of the key, not only of the batch
    with pytest.raises(ConfigError, match=r"multiple of 8, or set .* \(8 is the default; 1 on a CPU or one GPU\)\.$"):
        load_sft_plan([*base, "worker.actor.global_batch_size=4"])
    with pytest.raises(ConfigError, match="micro_batch_size_per_device_for_update"):
        load_sft_plan([*base, "trainer.n_gpus_per_node=1", "worker.actor.global_batch_size=6"])
    with pytest.raises(ConfigError, match="`data.apply_chat_template_kwargs.tokenize`: `tokenize` is an argument"):
        load_sft_plan([*base, "data.apply_chat_template_kwargs.tokenize=false"])


# ----------------------------------------------------------------------------------------------------------------------
# a real run
# ----------------------------------------------------------------------------------------------------------------------
def _sum_rows(a: int, b: int) -> dict:
    return {
        "messages": [
            {"role": "user", "content": f"What is {a}+{b}?"},
            {"role": "assistant", "content": f"The answer is \\boxed{{{a + b}}}."},
        ]
    }


def _run(command: str, args: list[str], log_path, timeout: float = 400) -> None:
    run_training(args, log_path, timeout, command)


def _assistant_nll(model, tokenizer, rows) -> float:
    """Token-mean cross-entropy of the rows' labelled tokens under a plain Hugging Face model (fp32)."""
    encoder = ConversationEncoder(tokenizer, None, DataConfig(), SFTConfig(), "test")
    total, count = 0.0, 0
    with torch.no_grad():
        for row in rows:
            item = encoder.encode(row)
            logits = model(item["input_ids"][None]).logits[0, :-1]
            nll = torch.nn.functional.cross_entropy(logits, item["input_ids"][1:], reduction="none")
            mask = item["loss_mask"][1:].bool()
            total, count = total + float(nll[mask].sum()), count + int(mask.sum())
    return total / count


VAL_ROWS = [_sum_rows(5, 1), _sum_rows(6, 2), _sum_rows(7, 0)]

# The run's data.override_chat_template: the model's own template and a marker it renders only when asked to, so
# training renders as without it (the loss tests hold) and a folder whose tokenizer holds it is told apart.
OVERRIDE_MARKER = "<<the run's template>>"
OVERRIDE_MARKER_BLOCK = "{% if show_override_marker is defined %}" + OVERRIDE_MARKER + "{% endif %}"


def _renders_the_override(folder, override) -> bool:
    from transformers import AutoTokenizer

    saved = AutoTokenizer.from_pretrained(folder)
    text = saved.apply_chat_template(CONVERSATION, tokenize=False, show_override_marker=True)
    return saved.chat_template == override and text.endswith(OVERRIDE_MARKER)


@pytest.fixture(scope="module")
def sft_run(tiny_model_path, tmp_path_factory):
    from transformers import AutoTokenizer

    folder = tmp_path_factory.mktemp("sft_run")
    override = folder / "chat_template.jinja"
    override.write_text(AutoTokenizer.from_pretrained(tiny_model_path).chat_template + OVERRIDE_MARKER_BLOCK)
    rows = [_sum_rows(a, b) for a in range(4) for b in range(2)]
    data = folder / "data.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    # three held-out conversations: an odd count over two workers (the dispatch pads and drops a row)
    (folder / "val.jsonl").write_text("".join(json.dumps(row) + "\n" for row in VAL_ROWS))
    args = [
        f"worker.actor.model.model_path={tiny_model_path}",
        f"data.train_files={data}",
        f"data.val_files={folder / 'val.jsonl'}",
        f"data.override_chat_template={override}",
        "trainer.val_freq=4",
        "data.shuffle=false",
        "trainer.n_gpus_per_node=2",
        "worker.actor.global_batch_size=4",
        "worker.actor.micro_batch_size_per_device_for_update=1",
        "worker.actor.optim.lr=3e-3",
        "worker.actor.fsdp.mp_param_dtype=fp32",
        "worker.actor.use_torch_compile=false",
        "trainer.max_steps=8",
        "trainer.save_freq=4",
        f"trainer.save_checkpoint_path={folder / 'ckpt'}",
    ]
    _run("sft", args, folder / "sft.log")
    metrics = {}
    for line in (folder / "ckpt" / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        metrics[row["step"]] = row
    return folder, rows, args, metrics


def test_sft_loss_falls_and_matches_a_plain_forward_at_the_first_step(sft_run, tiny_model_path, tokenizer):
    from transformers import AutoModelForCausalLM

    folder, rows, _, metrics = sft_run
    assert sorted(metrics) == list(range(9))  # step 0: the validation loss before training (val_before_train)
    losses = [metrics[step]["sft/loss"] for step in range(1, 9)]
    assert losses[-1] < losses[0] - 1.0, losses
    # step 1 (no shuffle: rows 0-3, micro-batches of 1 on 2 workers) is the token mean at the initial weights
    initial = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32)
    assert metrics[1]["sft/loss"] == pytest.approx(_assistant_nll(initial, tokenizer, rows[:4]), abs=1e-4)
    # "The answer is \boxed{N}." + <|im_end|>: 10 labelled tokens per conversation, 4 conversations per step
    assert metrics[1]["sft/tokens"] == 40
    assert (folder / "ckpt" / "global_step_4" / "actor").is_dir()
    kept = yaml.safe_load((folder / "ckpt" / "config.yaml").read_text())  # the config the run ran with, resolved
    assert (kept["worker"]["actor"]["optim"]["lr"], kept["data"]["train_files"]) == (3e-3, str(folder / "data.jsonl"))
    assert (folder / "ckpt" / "global_step_8" / "actor").is_dir()


def test_sft_validation_loss_is_the_held_out_token_mean_every_val_freq_steps(sft_run, tiny_model_path, tokenizer):
    from transformers import AutoModelForCausalLM

    folder, _, _, metrics = sft_run
    assert [step for step in sorted(metrics) if "val/loss" in metrics[step]] == [0, 4, 8]
    initial = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32)
    assert metrics[0]["val/loss"] == pytest.approx(_assistant_nll(initial, tokenizer, VAL_ROWS), abs=1e-4)
    # at the last step the workers' validation loss is the trained model's token mean over the three rows
    trained = AutoModelForCausalLM.from_pretrained(folder / "ckpt" / "huggingface", dtype=torch.float32)
    assert metrics[8]["val/loss"] == pytest.approx(_assistant_nll(trained, tokenizer, VAL_ROWS), abs=1e-4)
    assert metrics[8]["val/loss"] < metrics[4]["val/loss"] < metrics[0]["val/loss"]


def test_sft_output_folder_is_an_rl_actor_model_path(sft_run, tiny_model_path, tokenizer):
    from transformers import AutoModelForCausalLM

    folder, rows, _, _ = sft_run
    output = folder / "ckpt" / "huggingface"
    trained = AutoModelForCausalLM.from_pretrained(output, dtype=torch.float32)
    initial = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32)
    assert _assistant_nll(trained, tokenizer, rows) < _assistant_nll(initial, tokenizer, rows) - 1.0
    check = subprocess.run(
        [
            sys.executable, "-m", "easyrl", "check",
            f"config={REPO_ROOT / 'examples' / 'smollm2_arithmetic_grpo.yaml'}",
            f"worker.actor.model.model_path={output}",
        ],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert check.returncode == 0, check.stderr
    assert f"model_path: {output}" in check.stdout


def test_the_folders_of_a_run_with_an_override_template_hold_that_template(sft_run, tmp_path):
    """An RL run, `easyrl eval`, vLLM or transformers started from any of them prompt the model as it was trained."""
    from easyrl.trainer.merge import merge_checkpoint

    folder, _, _, _ = sft_run
    override = (folder / "chat_template.jinja").read_text()
    merged = merge_checkpoint(str(folder / "ckpt" / "global_step_4" / "actor"), str(tmp_path / "merged"))
    for saved in (
        folder / "ckpt" / "huggingface",
        folder / "ckpt" / "global_step_8" / "actor" / "huggingface",
        merged,
    ):
        assert _renders_the_override(saved, override), saved


def test_lora_sft_writes_the_base_with_the_adapters_merged_as_the_rl_model_and_the_adapters_beside_it(
    sft_run, tiny_model_path, tokenizer, tmp_path
):
    """transformers cannot load an adapter folder as a model: with LoRA the model folder an RL run takes is the base
    with the adapters merged in, and the adapters alone go to `adapter/` (as peft reads them)."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    folder, rows, args, _ = sft_run
    ckpt = tmp_path / "ckpt"
    lora_args = [a for a in args if not a.startswith(("trainer.save_checkpoint_path=", "data.val_files="))]
    lora_args += [f"trainer.save_checkpoint_path={ckpt}", "worker.actor.model.lora.rank=8", "trainer.save_freq=-1"]
    _run("sft", lora_args, tmp_path / "sft.log")
    assert "the adapters alone are in" in (tmp_path / "sft.log").read_text()
    merged = AutoModelForCausalLM.from_pretrained(ckpt / "huggingface", dtype=torch.float32)
    base = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32)
    base_nll = _assistant_nll(base, tokenizer, rows)
    adapted = PeftModel.from_pretrained(base, ckpt / "adapter")
    ids = tokenizer("What is 2+3? The answer is", return_tensors="pt").input_ids
    with torch.no_grad():
        torch.testing.assert_close(merged(ids).logits, adapted(ids).logits, rtol=1e-4, atol=1e-4)
    assert _assistant_nll(merged, tokenizer, rows) < base_nll - 0.5  # the adapters learned, and the merge kept it
    assert (ckpt / "huggingface" / "tokenizer_config.json").is_file()
    assert not (ckpt / "huggingface" / "adapter_config.json").exists()
    override = (folder / "chat_template.jinja").read_text()
    assert _renders_the_override(ckpt / "huggingface", override)  # the run's data.override_chat_template
    assert _renders_the_override(ckpt / "adapter", override)


@pytest.mark.slow
def test_sft_resumes_from_its_last_checkpoint(sft_run, tmp_path):
    folder, _, args, metrics = sft_run
    extended = [a for a in args if not a.startswith("trainer.max_steps=")] + ["trainer.max_steps=10"]
    _run("sft", extended, tmp_path / "resume.log")
    assert "Resuming from" in (tmp_path / "resume.log").read_text()
    # the folder keeps the config of each start; the resume names what it changed
    assert "in 1 key(s): trainer.max_steps: 8 -> 10." in (tmp_path / "resume.log").read_text()
    assert yaml.safe_load((folder / "ckpt" / "config.1.yaml").read_text())["trainer"]["max_steps"] == 8
    assert yaml.safe_load((folder / "ckpt" / "config.yaml").read_text())["trainer"]["max_steps"] == 10
    rows = [json.loads(line) for line in (folder / "ckpt" / "metrics.jsonl").read_text().splitlines()]
    steps = [row["step"] for row in rows]
    assert steps == list(range(11))  # steps 0-8 kept once (no second validation before training), 9 and 10 appended
    # the loader continued: the batches of steps 9 and 10 are those an unbroken run would draw (rows 0-3, 4-7)
    assert rows[9]["sft/epoch"] == 4 and rows[10]["sft/epoch"] == 4
    assert rows[9]["sft/loss"] < metrics[1]["sft/loss"]


@pytest.mark.slow
def test_sft_resumes_on_fewer_rows_than_its_checkpoints_position_at_the_next_epoch(sft_run, tmp_path):
    """The same command rerun after rows were cleaned out of the data file: the checkpoint's position (8 rows into
    its epoch) is past the end of the 6 rows left; the epoch ends there and training goes on (it stopped with a bare
    StopIteration from the loader). The 2 rows a batch of 4 leaves over each epoch are said."""
    import shutil

    folder, rows, args, _ = sft_run
    shutil.copytree(folder / "ckpt", tmp_path / "ckpt")
    fewer = tmp_path / "fewer.jsonl"
    fewer.write_text("".join(json.dumps(row) + "\n" for row in rows[:6]))
    replaced = {"data.train_files": str(fewer), "trainer.save_checkpoint_path": str(tmp_path / "ckpt")}
    rerun = [a for a in args if a.split("=")[0] not in (*replaced, "trainer.max_steps")]
    rerun += [f"{key}={value}" for key, value in replaced.items()] + ["trainer.max_steps=10"]
    _run("sft", rerun, tmp_path / "resume.log")
    text = (tmp_path / "resume.log").read_text()
    assert "data.train_files has 6 usable rows and had 8 when " in text
    assert "was saved 8 rows into its epoch, past the end of the 6 usable rows data.train_files has now" in text
    assert "data.train_files: 6 usable rows make 1 batches of worker.actor.global_batch_size=4 per epoch, and " in text
    metrics = [json.loads(line) for line in (tmp_path / "ckpt" / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in metrics] == list(range(11))
    assert [row["sft/epoch"] for row in metrics[9:]] == [4, 5]  # one batch of the 6 rows per epoch


@pytest.mark.slow
def test_lora_sft_of_a_vision_language_model_writes_a_merged_model_with_its_processor(tmp_path):
    """The shapes cold start with LoRA for two steps: the merged folder is the Qwen2.5-VL class with its processor,
    and its logits on a picture are the base's with the adapters applied."""
    from peft import PeftModel
    from PIL import Image
    from transformers import AutoModelForImageTextToText, AutoProcessor

    from easyrl.demo.builtin_models import resolve_model_path

    ckpt = tmp_path / "ckpt"
    args = [
        f"config={REPO_ROOT / 'examples' / 'shapes_cold_start_sft.yaml'}",
        "trainer.max_steps=2",
        "trainer.save_freq=-1",
        "worker.actor.model.lora.rank=8",
        f"trainer.save_checkpoint_path={ckpt}",
    ]
    _run("sft", args, tmp_path / "sft.log")
    merged = AutoModelForImageTextToText.from_pretrained(ckpt / "huggingface", dtype=torch.float32)
    assert type(merged).__name__ == "Qwen2_5_VLForConditionalGeneration"
    base = AutoModelForImageTextToText.from_pretrained(resolve_model_path("builtin://Small-Qwen2.5-VL")).float()
    processor = AutoProcessor.from_pretrained(ckpt / "huggingface")
    picture = Image.new("RGB", (112, 112), "white")
    text = "How many red circles?<|vision_start|><|image_pad|><|vision_end|>"
    inputs = processor(text=[text], images=[picture], return_tensors="pt")
    with torch.no_grad():
        base_logits = base(**inputs).logits
        adapted = PeftModel.from_pretrained(base, ckpt / "adapter")  # wraps base's own modules
        merged_logits = merged(**inputs).logits
        torch.testing.assert_close(merged_logits, adapted(**inputs).logits, rtol=1e-4, atol=1e-4)
    assert (merged_logits - base_logits).abs().max() > 1e-3  # two steps moved the adapters off their zero start


@pytest.mark.slow
def test_sft_of_a_vision_language_model_matches_a_plain_forward_with_pictures_and_videos_in_two_turns(tmp_path):
    """A picture in the first user turn, a picture or a video (mixed rows in one micro-batch) in a later one: the
    workers' first-step loss (padding-free, pixel inputs built per micro-batch) equals a plain Hugging Face forward of
    each conversation with its media."""
    from PIL import Image
    from transformers import AutoModelForImageTextToText

    from easyrl.data.tokenizer import load_tokenizer_and_processor
    from easyrl.testing.tiny_vl import build_tiny_qwen2_5_vl

    model_path = build_tiny_qwen2_5_vl(tmp_path / "vl")
    colours = [(255, 0, 0), (0, 255, 0), (0, 0, 255), (255, 255, 0)]
    for n, colour in enumerate(colours):
        Image.new("RGB", (56, 56), colour).save(tmp_path / f"img{n}.png")
    rows = [
        {
            "messages": [
                {"role": "user", "content": "<image>What colour?"},
                {"role": "assistant", "content": f"Colour {n}."},
                {"role": "user", "content": f"And this one? {'<video>' if n % 2 else '<image>'}"},
                {"role": "assistant", "content": f"Colour {(n + 1) % 4}."},
            ],
            "images": [f"img{n}.png"] if n % 2 else [f"img{n}.png", f"img{(n + 1) % 4}.png"],
        }
        | ({"videos": [[f"img{(n + 1) % 4}.png"] * 2 + [f"img{n}.png"] * 2]} if n % 2 else {})
        for n in range(4)
    ]
    data = tmp_path / "vl.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    args = [
        f"worker.actor.model.model_path={model_path}",
        f"data.train_files={data}",
        "data.shuffle=false",
        "data.min_pixels=784",
        "data.max_pixels=3136",
        "trainer.n_gpus_per_node=2",
        "worker.actor.global_batch_size=4",
        "worker.actor.micro_batch_size_per_device_for_update=2",
        "worker.actor.fsdp.mp_param_dtype=fp32",
        "worker.actor.use_torch_compile=false",
        "trainer.max_steps=2",
        f"trainer.save_checkpoint_path={tmp_path / 'ckpt'}",
    ]
    _run("sft", args, tmp_path / "sft.log")
    first = json.loads((tmp_path / "ckpt" / "metrics.jsonl").read_text().splitlines()[0])

    tokenizer, processor = load_tokenizer_and_processor(str(model_path))
    data_config = DataConfig(min_pixels=784, max_pixels=3136)
    encoder = ConversationEncoder(tokenizer, processor, data_config, SFTConfig(), "test", media_dirs=(str(tmp_path),))
    model = AutoModelForImageTextToText.from_pretrained(model_path, dtype=torch.float32)
    total, count = 0.0, 0
    with torch.no_grad():
        for row in rows:
            item = encoder.encode(row)
            media = item["multi_modal_data"]
            inputs = dict(processor.image_processor(images=media["images"], return_tensors="pt"))
            if "videos" in media:
                videos = processor.video_processor(videos=media["videos"], do_sample_frames=False, return_tensors="pt")
                inputs.update(videos)
            # the positions the dataset computed (vLLM's and the released Qwen2.5-VL's rope after a video)
            inputs["position_ids"] = item["position_ids"][:, None]
            logits = model(input_ids=item["input_ids"][None], **inputs).logits[0, :-1]
            nll = torch.nn.functional.cross_entropy(logits, item["input_ids"][1:], reduction="none")
            mask = item["loss_mask"][1:].bool()
            total, count = total + float(nll[mask].sum()), count + int(mask.sum())
    # "Colour", " ", "N", ".", <|im_end|>: 5 labelled tokens per reply, 2 replies per conversation
    assert first["sft/tokens"] == count == 4 * 2 * 5
    assert first["sft/loss"] == pytest.approx(total / count, abs=1e-4)
    # the output folder has everything the model folder had (processor included): an RL run can start from it
    output = tmp_path / "ckpt" / "huggingface"
    assert {p.name for p in model_path.iterdir()} <= {p.name for p in output.iterdir()}


def _launch_long_sft(sft_run, save_dir, log_path, extra: str):
    """The fixture's SFT run, 400 steps long (to be interrupted), writing to ``save_dir``, started in the background."""
    args = [a for a in sft_run[2] if not a.startswith(("trainer.max_steps=", "trainer.save_checkpoint_path="))]
    args += ["trainer.max_steps=400", extra, f"trainer.save_checkpoint_path={save_dir}"]
    return launch_training(args, log_path, "sft")


@pytest.mark.slow
def test_a_stop_signal_ends_sft_after_the_step_with_a_checkpoint_it_resumes_from(sft_run, tmp_path):
    save_dir, log_path = tmp_path / "ckpt", tmp_path / "stopped.log"
    proc = _launch_long_sft(sft_run, save_dir, log_path, "trainer.save_freq=-1")
    metrics_file = save_dir / "metrics.jsonl"
    wait_until(
        lambda: metrics_file.exists() and len(metrics_file.read_text().splitlines()) >= 3, "step 2", proc, log_path
    )
    os.kill(proc.pid, signal.SIGTERM)
    try:
        code = proc.wait(timeout=120)
    finally:
        kill_process_group(proc)
    assert code == 128 + signal.SIGTERM, log_tail(log_path)
    step = max(metrics_by_step(save_dir))
    assert step < 400
    assert (save_dir / f"global_step_{step}" / "actor").is_dir()
    assert "stopped by SIGTERM" in log_tail(log_path)
    assert (save_dir / "curves.png").is_file()  # the losses so far, drawn on the way out


@pytest.mark.slow
def test_a_killed_sft_worker_is_restarted_and_the_steps_after_equal_the_unbroken_run(sft_run, tmp_path):
    from tests.test_faults_runs import _worker_pids

    reference = sft_run[3]
    save_dir, log_path = tmp_path / "ckpt", tmp_path / "restarted.log"
    proc = _launch_long_sft(sft_run, save_dir, log_path, "trainer.max_restarts=1")
    try:
        wait_for_path(save_dir / "global_step_4" / "COMPLETE", proc, log_path)
        victim = _worker_pids(proc.pid)[-1]
        os.kill(victim, signal.SIGKILL)  # what the kernel's out-of-memory killer sends

        def restarted_to_step_8() -> bool:
            rows = metrics_by_step(save_dir)
            return rows.get(8, {}).get("trainer/restarts") == 1

        wait_until(restarted_to_step_8, "step 8 after the restart", proc, log_path)
        os.kill(proc.pid, signal.SIGTERM)
        code = proc.wait(timeout=120)
    finally:
        kill_process_group(proc)
    text = log_path.read_text(errors="replace")
    assert code == 128 + signal.SIGTERM, log_tail(log_path)
    assert f"(pid {victim}) died during `" in text
    assert f"Restarting every worker and resuming from {save_dir / 'global_step_4'} (restart 1 of" in text
    rows = metrics_by_step(save_dir)
    assert rows[4]["trainer/restarts"] == 0
    for step in range(5, 9):  # the loader and the weights continued from step 4 exactly
        assert rows[step]["trainer/restarts"] == 1
        assert rows[step]["sft/loss"] == pytest.approx(reference[step]["sft/loss"], abs=1e-5), step
        assert rows[step]["sft/tokens"] == reference[step]["sft/tokens"]
