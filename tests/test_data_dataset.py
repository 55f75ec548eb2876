"""RLHFDataset on text rows: left-padded inputs, raw prompt ids, overlong handling and clear row errors."""

import json
import re
import subprocess

import pytest
import torch

from easyrl.config import DataConfig
from easyrl.data.collate import collate_fn
from easyrl.data.dataset import RLHFDataset


def write_jsonl(path, rows):
    path.write_text("\n".join(json.dumps(row) for row in rows))
    return str(path)


def config(**overrides) -> DataConfig:
    values = {
        "prompt_key": "problem",
        "answer_key": "answer",
        "max_prompt_length": 64,
        "filter_overlong_prompts": False,
    }
    return DataConfig(**{**values, **overrides})


def test_text_row_becomes_left_padded_inputs(tmp_path, tokenizer):
    path = write_jsonl(tmp_path / "d.jsonl", [{"problem": "What is 2 + 3?", "answer": "5"}])
    item = RLHFDataset(path, tokenizer, None, config())[0]
    prompt_ids = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is 2 + 3?"}], add_generation_prompt=True, tokenize=True
    )
    prompt_ids = list(getattr(prompt_ids, "input_ids", prompt_ids))
    n = len(prompt_ids)
    assert item["raw_prompt_ids"] == prompt_ids
    assert item["input_ids"][-n:].tolist() == prompt_ids
    assert item["input_ids"][:-n].eq(tokenizer.pad_token_id).all()
    assert item["attention_mask"].tolist() == [0] * (64 - n) + [1] * n
    assert item["position_ids"].tolist() == [0] * (64 - n) + list(range(n))
    assert item["ground_truth"] == "5" and item["data_source"] == "d"


def test_format_prompt_is_applied(tmp_path, tokenizer):
    template = tmp_path / "t.jinja"
    template.write_text("Q: {{ content }} Think step by step.")
    path = write_jsonl(tmp_path / "d.jsonl", [{"problem": "2+3?", "answer": "5"}])
    item = RLHFDataset(path, tokenizer, None, config(format_prompt=str(template)))[0]
    assert "<|im_start|>user\nQ: 2+3? Think step by step.<|im_end|>" in tokenizer.decode(item["raw_prompt_ids"])


def test_system_prompt_opens_each_prompt_unless_its_messages_have_their_own(tmp_path, tokenizer):
    """EasyR1's first releases set the model's instructions with data.system_prompt."""
    path = write_jsonl(
        tmp_path / "d.jsonl",
        [
            {"problem": "2+3?", "answer": "5"},
            {"problem": [{"role": "system", "content": "Own."}, {"role": "user", "content": "1+1?"}], "answer": "2"},
        ],
    )
    dataset = RLHFDataset(path, tokenizer, None, config(system_prompt="Think first."))
    text, own = (tokenizer.decode(dataset[i]["raw_prompt_ids"]) for i in range(2))
    assert text.startswith("<|im_start|>system\nThink first.<|im_end|>\n<|im_start|>user\n2+3?<|im_end|>")
    assert own.startswith("<|im_start|>system\nOwn.<|im_end|>") and "Think first." not in own


def test_a_judged_run_carries_each_prompt_as_messages_before_the_chat_template(tmp_path, tokenizer):
    template = tmp_path / "t.jinja"
    template.write_text("Q: {{ content }} Think step by step.")
    rows = [
        {"problem": "2+3?", "answer": "5"},
        {"problem": [{"role": "system", "content": "Own."}, {"role": "user", "content": "1+1?"}], "answer": "2"},
    ]
    path = write_jsonl(tmp_path / "d.jsonl", rows)
    options = config(format_prompt=str(template), system_prompt="Think first.")
    dataset = RLHFDataset(path, tokenizer, None, options, carry_prompt_messages=True)
    assert dataset[0]["prompt_messages"] == [
        {"role": "system", "content": "Think first."},
        {"role": "user", "content": "Q: 2+3? Think step by step."},
    ]
    assert dataset[1]["prompt_messages"] == [
        {"role": "system", "content": "Own."},
        {"role": "user", "content": "Q: 1+1? Think step by step."},
    ]
    batch = collate_fn([dataset[0], dataset[1]])
    assert batch.non_tensor_batch["prompt_messages"].shape == (2,)  # lists of equal length stay one per sample
    assert "prompt_messages" not in RLHFDataset(path, tokenizer, None, options)[0]


def test_each_item_names_its_file_and_row_for_the_warnings_about_its_samples(tmp_path, tokenizer):
    from easyrl.data.dataset import ROW_PLACE_KEY

    rows = [{"problem": f"What is {i} + 1?", "answer": str(i + 1)} for i in range(3)]
    single = RLHFDataset(write_jsonl(tmp_path / "math.jsonl", rows), tokenizer, None, config())
    assert [single[i][ROW_PLACE_KEY] for i in range(3)] == [f"data.train_files math.jsonl row {i}" for i in range(3)]
    folder = tmp_path / "parts"
    folder.mkdir()
    write_jsonl(folder / "a.jsonl", rows[:2])
    write_jsonl(folder / "b.jsonl", [{"problem": None, "answer": "0"}, rows[2]])  # its row 0 is skipped
    parts = RLHFDataset(str(folder), tokenizer, None, config(), config_key="data.val_files")
    assert [parts[i][ROW_PLACE_KEY] for i in range(len(parts))] == [
        "data.val_files a.jsonl row 0",
        "data.val_files a.jsonl row 1",
        "data.val_files b.jsonl row 1",
    ]
    batch = collate_fn([parts[2], parts[0]])
    assert batch.non_tensor_batch[ROW_PLACE_KEY].tolist() == [
        "data.val_files b.jsonl row 1",
        "data.val_files a.jsonl row 0",
    ]


def test_each_file_of_a_folder_is_its_own_data_source_and_shards_of_one_are_one(tmp_path, tokenizer):
    # several benchmarks given as one folder (data.val_files takes one path) keep one metric each
    folder = tmp_path / "benchmarks"
    folder.mkdir()
    row = {"problem": "What is 1 + 1?", "answer": "2"}
    write_jsonl(folder / "aime.jsonl", [row])
    write_jsonl(folder / "gsm8k-00000-of-00002.jsonl", [row, row])
    write_jsonl(folder / "gsm8k-00001-of-00002.jsonl", [row, {"problem": None, "answer": "0"}])
    write_jsonl(folder / "math500.jsonl", [row, {**row, "data_source": "math500/geometry"}])
    dataset = RLHFDataset(str(folder), tokenizer, None, config(), config_key="data.val_files")
    sources = [dataset[i]["data_source"] for i in range(len(dataset))]
    assert sources == ["aime", "gsm8k", "gsm8k", "gsm8k", "math500", "math500/geometry"]
    assert dataset.kept_sources() == {"aime": 1, "gsm8k": 3, "math500": 1, "math500/geometry": 1}
    assert dataset.skipped_sources == {"gsm8k": 1}
    # one file keeps its name, whatever its rows are
    single = RLHFDataset(str(folder / "aime.jsonl"), tokenizer, None, config())
    assert single[0]["data_source"] == "aime" and single.kept_sources() == {"aime": 1}


def test_overlong_prompts_are_filtered_in_parallel_and_counted(tmp_path, tokenizer):
    rows = [{"problem": "short", "answer": "1"}] * 100 + [{"problem": "long " * 80, "answer": "2"}] * 30
    path = write_jsonl(tmp_path / "d.jsonl", rows)
    dataset = RLHFDataset(
        path, tokenizer, None, config(filter_overlong_prompts=True, filter_overlong_prompts_workers=2)
    )
    assert (len(dataset), dataset.num_filtered_overlong) == (100, 30)
    assert all(dataset[i]["ground_truth"] == "1" for i in (0, 99))


def test_overlong_prompt_without_filtering_keeps_its_first_tokens_as_easyr1_does(tmp_path, tokenizer, caplog):
    # EasyR1 (truncation="right") keeps the first max_prompt_length tokens; the model and vLLM see the same ones
    path = write_jsonl(
        tmp_path / "d.jsonl", [{"problem": "ok", "answer": "1"}, {"problem": "long " * 80, "answer": "2"}]
    )
    full = tokenizer.apply_chat_template(
        [{"role": "user", "content": "long " * 80}], add_generation_prompt=True, tokenize=True
    )
    full = list(getattr(full, "input_ids", full))
    assert len(full) > 64
    dataset = RLHFDataset(path, tokenizer, None, config())
    # counted when the dataset is built (before Ray starts), not when the row is first drawn
    assert dataset.num_truncated == 1
    assert "1 of 2 prompts are longer than data.max_prompt_length=64 tokens and are cut" in caplog.text
    assert "(data.filter_overlong_prompts=false, as EasyR1 does; row 1)" in caplog.text
    item = dataset[1]
    assert item["input_ids"].tolist() == full[:64] and item["raw_prompt_ids"] == full[:64]
    assert item["attention_mask"].tolist() == [1] * 64 and item["position_ids"].tolist() == list(range(64))


def test_a_cut_that_leaves_every_prompt_only_what_all_share_is_refused(tmp_path, tokenizer, caplog):
    # a long system prompt and a cut inside it: every row would become the same prompt without its question
    rows = [{"problem": f"What is {a} + {a}?", "answer": str(2 * a)} for a in (3, 4, 5)]
    path = write_jsonl(tmp_path / "d.jsonl", rows)
    system = "You are a careful assistant who checks every step twice. " * 6
    with pytest.raises(ValueError, match=r"data.max_prompt_length=64 cuts every prompt before its own text: row 0 and "
                       r"row 1 differ only after token \d+.*Raise data.max_prompt_length well above"):  # fmt: skip
        RLHFDataset(path, tokenizer, None, config(system_prompt=system))
    # a cut that keeps part of each question is EasyR1's right truncation: said, not refused
    full = tokenizer.apply_chat_template(
        [{"role": "system", "content": system}, {"role": "user", "content": "What is 3 + 3?"}],
        tokenize=True,
        add_generation_prompt=True,
    )
    shared = len(list(getattr(full, "input_ids", full))) - 8
    kept = RLHFDataset(path, tokenizer, None, config(system_prompt=system, max_prompt_length=shared + 4))
    assert kept.num_truncated == 3 and len({tuple(kept[i]["input_ids"].tolist()) for i in range(3)}) == 3
    # the same prompt in every row is not mistaken for a cut inside the shared start
    same = write_jsonl(tmp_path / "same.jsonl", [{"problem": "long " * 80, "answer": "1"}] * 2)
    assert RLHFDataset(same, tokenizer, None, config()).num_truncated == 2


def test_everything_filtered_is_a_clear_error(tmp_path, tokenizer):
    path = write_jsonl(tmp_path / "d.jsonl", [{"problem": "long " * 80, "answer": "2"}])
    with pytest.raises(ValueError, match="no rows left after screening \\(1 longer than data.max_prompt_length=64"):
        RLHFDataset(path, tokenizer, None, config(filter_overlong_prompts=True))


def test_row_missing_the_prompt_is_skipped_counted_and_named(tmp_path, tokenizer, caplog):
    path = write_jsonl(tmp_path / "d.jsonl", [{"problem": "ok", "answer": "1"}, {"problem": None, "answer": "2"}])
    dataset = RLHFDataset(path, tokenizer, None, config())
    assert len(dataset) == 1 and dataset.unusable_rows == [(1, "no value for data.prompt_key='problem'")]
    assert "skipped 1 of 2 rows without a value for data.prompt_key='problem' (row 1)" in caplog.text


def test_missing_prompt_column_lists_the_columns(tmp_path, tokenizer):
    path = write_jsonl(tmp_path / "d.jsonl", [{"question": "ok", "answer": "1"}])
    with pytest.raises(
        KeyError, match=r"no column 'problem' \(data.prompt_key\); the columns are \['question', 'answer'\]"
    ):
        RLHFDataset(path, tokenizer, None, config())


def test_rows_wrapped_in_a_json_objects_field_are_named_with_how_to_unwrap_them(tmp_path, tokenizer):
    """`{"data": [rows]}` (SQuAD's shape, many exports) read as one row with a column `data`, and the error listed
    that column alone; one row whose field is a list of chat messages stays a row."""
    path = tmp_path / "wrapped.json"
    path.write_text(json.dumps({"version": "1", "data": [{"problem": "1+1", "answer": "2"}] * 3}))
    with pytest.raises(KeyError) as error:
        RLHFDataset(str(path), tokenizer, None, config())
    assert "the columns are ['version', 'data']. " in error.value.args[0]
    assert "wrapped.json is one object holding 3 rows in its field 'data'" in error.value.args[0]
    command = re.search(r"`(python -c .*)`", error.value.args[0]).group(1)
    written = subprocess.run(command, shell=True, cwd=tmp_path, capture_output=True, text=True, check=True)
    assert [json.loads(line) for line in (tmp_path / "rows.jsonl").read_text().splitlines()] == [
        {"problem": "1+1", "answer": "2"}
    ] * 3, written.stderr
    path.write_text(json.dumps({"messages": [{"role": "user", "content": "Hi"}], "answer": "1"}))
    with pytest.raises(KeyError) as error:
        RLHFDataset(str(path), tokenizer, None, config())
    assert error.value.args[0].endswith(
        "no column 'problem' (data.prompt_key); the columns are ['messages', 'answer']."
    )


def test_collate_stacks_tensors_and_keeps_the_rest_per_sample(tmp_path, tokenizer):
    rows = [{"problem": "a", "answer": "1"}, {"problem": "b b b", "answer": "2"}]
    dataset = RLHFDataset(write_jsonl(tmp_path / "d.jsonl", rows), tokenizer, None, config())
    batch = collate_fn([dataset[0], dataset[1]])
    assert batch.batch["input_ids"].shape == (2, 64) and batch.batch["position_ids"].dtype == torch.long
    assert list(batch.non_tensor_batch["ground_truth"]) == ["1", "2"]
    assert [len(ids) for ids in batch.non_tensor_batch["raw_prompt_ids"]] == batch.batch["attention_mask"].sum(
        -1
    ).tolist()


def test_verl_rows_with_chat_message_prompts_and_the_answer_inside_a_column(tmp_path, tokenizer):
    # verl's preprocessed data: `prompt` is a list of chat messages, the answer is reward_model.ground_truth
    import datasets

    rows = [
        {
            "data_source": "openai/gsm8k",
            "prompt": [
                {"role": "system", "content": "Answer after ####."},
                {"role": "user", "content": f"What is {i} + 1?"},
            ],
            "reward_model": {"style": "rule", "ground_truth": str(i + 1)},
            "extra_info": {"index": i},
        }
        for i in range(3)
    ]
    datasets.Dataset.from_list(rows).to_parquet(str(tmp_path / "train.parquet"))
    template = tmp_path / "t.jinja"
    template.write_text("{{ content }} Think first.")
    data_config = config(prompt_key="prompt", answer_key="reward_model.ground_truth", format_prompt=str(template))
    item = RLHFDataset(str(tmp_path / "train.parquet"), tokenizer, None, data_config)[2]
    expected = tokenizer.apply_chat_template(
        [
            {"role": "system", "content": "Answer after ####."},
            {"role": "user", "content": "What is 2 + 1? Think first."},
        ],
        add_generation_prompt=True,
        tokenize=False,
    )
    assert tokenizer.decode(item["raw_prompt_ids"]) == expected
    assert item["ground_truth"] == "3" and item["data_source"] == "openai/gsm8k"


def test_a_prompt_list_that_is_not_chat_messages_is_skipped_and_named(tmp_path, tokenizer, caplog):
    rows = [{"problem": ["two", "parts"], "answer": "1"}, {"problem": "fine", "answer": "2"}]
    dataset = RLHFDataset(write_jsonl(tmp_path / "d.jsonl", rows), tokenizer, None, config())
    assert len(dataset) == 1 and dataset[0]["ground_truth"] == "2"
    assert "the prompt is a list, so it must be chat messages" in caplog.text and "item 0 is 'two'" in caplog.text


CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2 + 3?"}]


def test_an_sft_conversation_given_as_prompts_loses_its_answer_and_says_so(tmp_path, tokenizer, caplog):
    """An SFT file (messages ending with the assistant's answer) given as RL / eval data: the prompt held the answer,
    then asked again. The trailing assistant messages are left out, and the rows counted."""
    sft = [
        {"messages": [*CHAT, {"role": "assistant", "content": "5"}], "answer": "5"},
        {"messages": [{"role": "user", "content": "1+1?"}], "answer": "2"},  # a prompt as it should be
        {
            "messages": [
                {"role": "user", "content": "2+2?"},
                {"role": "assistant", "content": "Let me see."},
                {"role": "assistant", "content": "4"},
            ],
            "answer": "4",
        },
    ]
    path = write_jsonl(tmp_path / "sft.jsonl", sft)
    with caplog.at_level("WARNING", logger="easyrl.data.dataset"):
        dataset = RLHFDataset(path, tokenizer, None, config(prompt_key="messages"))
    texts = [tokenizer.decode(dataset[i]["raw_prompt_ids"]) for i in range(3)]
    assert texts[0].endswith("<|im_start|>user\nWhat is 2 + 3?<|im_end|>\n<|im_start|>assistant\n")
    assert (
        "<|im_start|>assistant\n5" not in texts[0] and "Let me see" not in texts[2] and "4<|im_end|>" not in texts[2]
    )
    assert [dataset[i]["ground_truth"] for i in range(3)] == ["5", "2", "4"]
    warned = [r.getMessage() for r in caplog.records if "end with `assistant` messages" in r.getMessage()]
    # a column that starts with a text prompt is read to its end
    mixed = write_jsonl(tmp_path / "mixed.jsonl", [{"messages": "1+2?", "answer": "3"}, *sft])
    caplog.clear()
    with caplog.at_level("WARNING", logger="easyrl.data.dataset"):
        RLHFDataset(mixed, tokenizer, None, config(prompt_key="messages"))
    assert "2 of 4 prompts (data.prompt_key=messages) end with `assistant` messages" in caplog.text
    assert warned == [
        "data.train_files: 2 of 3 prompts (data.prompt_key=messages) end with `assistant` messages, as an SFT "
        "conversation ends with its answer (rows 0, 2): they are left out of those prompts, or the model would read "
        "the answer and be asked again. The reward's ground truth is data.answer_key=answer."
    ]


def test_chat_messages_held_as_json_text_are_read_as_the_messages_sft_reads(tmp_path, tokenizer):
    """A CSV cell (or a column written with json.dumps) holding chat messages is read as those messages, as `easyrl
    sft` reads it (it was trained on as the literal JSON text); other text, though it starts with `[`, stays text."""
    import csv

    template = tmp_path / "t.jinja"
    template.write_text("{{ content }} Think first.")
    path = tmp_path / "d.csv"
    not_messages = ['["two", "parts"]', '[{"role": "user"}]', "[1, 2] + [3]?", "[not json"]
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["problem", "answer"])
        writer.writerow([json.dumps(CHAT), "5"])
        for text in not_messages:
            writer.writerow([text, "0"])
    dataset = RLHFDataset(str(path), tokenizer, None, config(format_prompt=str(template)))
    as_list = write_jsonl(tmp_path / "l.jsonl", [{"problem": CHAT, "answer": "5"}])
    as_list = RLHFDataset(as_list, tokenizer, None, config(format_prompt=str(template)))
    assert dataset[0]["raw_prompt_ids"] == as_list[0]["raw_prompt_ids"]
    assert "<|im_start|>user\nWhat is 2 + 3? Think first.<|im_end|>" in tokenizer.decode(dataset[0]["raw_prompt_ids"])
    assert dataset[0]["conversational"] is True
    for i, text in enumerate(not_messages, 1):
        assert f"<|im_start|>user\n{text} Think first.<|im_end|>" in tokenizer.decode(dataset[i]["raw_prompt_ids"])
        assert "conversational" not in dataset[i]


def test_a_single_message_prompt_is_a_list_of_one_and_another_mapping_is_skipped_and_named(
    tmp_path, tokenizer, caplog
):
    """A prompt that was a dict became the Python text "{'role': 'user', 'content': ...}" without a word."""
    rows = [
        {"problem": {"role": "user", "content": "What is 2 + 3?"}, "answer": "5"},
        {"problem": {"question": "What is 2 + 3?"}, "answer": "5"},
        {"problem": "What is 2 + 3?", "answer": "5"},
    ]
    dataset = RLHFDataset(write_jsonl(tmp_path / "d.jsonl", rows), tokenizer, None, config())
    assert len(dataset) == 2 and dataset[0]["raw_prompt_ids"] == dataset[1]["raw_prompt_ids"]
    assert dataset[0]["conversational"] is True
    reason = (
        "the prompt is a mapping with the keys ['question'], not a chat message {'role': ..., 'content': ...}, a list "
        "of them or a text"
    )
    assert dataset.unusable_rows == [(1, reason)]
    assert f"skipped 1 of 3 rows whose pictures/videos or prompts cannot be used (row 1: {reason})" in caplog.text
    assert dataset.skipped_rows() == [{"data": "data.train_files", "row": 1, "reason": reason}]


def test_a_dotted_answer_key_needs_its_column(tmp_path, tokenizer):
    path = write_jsonl(tmp_path / "d.jsonl", [{"problem": "p", "answer": "1"}])
    with pytest.raises(KeyError, match=r"no column 'reward_model\.ground_truth' \(data\.answer_key\)"):
        RLHFDataset(path, tokenizer, None, config(answer_key="reward_model.ground_truth"))
    rows = [{"problem": "p", "meta": {"answer": "7"}}, {"problem": "q", "meta": {"other": 1}}]
    dataset = RLHFDataset(write_jsonl(tmp_path / "m.jsonl", rows), tokenizer, None, config(answer_key="meta.answer"))
    assert len(dataset) == 1 and dataset[0]["ground_truth"] == "7"  # the row without the field is skipped


def test_missing_column_with_a_close_name_suggests_it(tmp_path, tokenizer):
    path = write_jsonl(tmp_path / "d.jsonl", [{"Problem": "ok", "answers": "1"}])
    with pytest.raises(
        KeyError, match=r"the columns are \['Problem', 'answers'\]\. Did you mean data.prompt_key=Problem"
    ):
        RLHFDataset(path, tokenizer, None, config())
    with pytest.raises(KeyError, match=r"Did you mean data.answer_key=answers\?"):
        RLHFDataset(path, tokenizer, None, config(prompt_key="Problem"))


def test_a_judge_reads_pictures_and_videos_as_their_placeholders():
    from easyrl.data.dataset import text_messages

    parts = [{"type": "image"}, {"type": "text", "text": "How many?"}, {"type": "video"}]
    assert text_messages([{"role": "user", "content": parts}]) == [
        {"role": "user", "content": "<image>How many?<video>"}
    ]


def test_rows_skipped_for_one_reason_are_named_together_in_the_warning(tmp_path, tokenizer, caplog):
    """Before: the same reason was repeated once per row (6 copies for 6 rows over worker.rollout.limit_images)."""
    odd = {"problem": {"question": "?"}, "answer": "5"}
    rows = [odd, {"problem": "What is 2 + 3?", "answer": "5"}, odd, {"problem": {"q": "?"}, "answer": "5"}, odd]
    dataset = RLHFDataset(write_jsonl(tmp_path / "d.jsonl", rows), tokenizer, None, config())
    assert len(dataset) == 1 and [index for index, _ in dataset.unusable_rows] == [0, 2, 3, 4]
    reason = "the prompt is a mapping with the keys {}, not a chat message {{'role': ..., 'content': ...}}, a list"
    assert (
        f"skipped 4 of 5 rows whose pictures/videos or prompts cannot be used (rows 0, 2, 4: "
        f"{reason.format(['question'])}"
    ) in caplog.text
    assert f"; row 3: {reason.format(['q'])}" in caplog.text
    assert caplog.text.count("['question']") == 1
