"""SFT rows as chat messages: tool calls reach the chat template, a reply that renders empty is skipped and named,
and data whose columns the keys do not name is refused with the key that likely fits."""

import json

import pytest

from easyrl.config.schema import DataConfig, SFTConfig
from easyrl.data.dataset import RLHFDataset
from easyrl.data.sft import ConversationEncoder, SFTDataset, normalize_messages


# a Qwen2.5-style template (trim_blocks / lstrip_blocks as transformers renders it): tool calls and tool results shown
TOOL_TEMPLATE = """{%- if tools %}
{{- '<|im_start|>system\n<tools>' }}
{%- for tool in tools %}{{- '\n' + (tool | tojson) }}{%- endfor %}
{{- '\n</tools><|im_end|>\n' }}
{%- endif %}
{%- for message in messages %}
{%- if message.role == "assistant" and message.tool_calls %}
{{- '<|im_start|>assistant\\n' + message.content }}
{%- for call in message.tool_calls %}
{{- '<tool_call>\\n{"name": "' + call.function.name + '", "arguments": ' + (call.function.arguments | tojson) + '}\\n</tool_call>' }}
{%- endfor %}
{{- '<|im_end|>\\n' }}
{%- elif message.role == "tool" %}
{{- '<|im_start|>user\\n<tool_response>\\n' + message.name + ': ' + message.content + '\\n</tool_response><|im_end|>\\n' }}
{%- else %}
{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"""

CALL = {"id": "call_0", "type": "function", "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'}}
TOOL_CONVERSATION = [
    {"role": "user", "content": "2+3?"},
    {"role": "assistant", "content": None, "tool_calls": [CALL]},
    {"role": "tool", "name": "add", "tool_call_id": "call_0", "content": "5"},
    {"role": "assistant", "content": "It is 5."},
]
PLAIN = [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}]


def write_rows(path, rows):
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(path)


def labelled_text(tokenizer, item) -> str:
    return tokenizer.decode(item["input_ids"][item["loss_mask"].bool()])


def test_the_keys_a_chat_template_reads_are_kept_and_none_filled_ones_dropped():
    messages = normalize_messages(TOOL_CONVERSATION, 0)
    # OpenAI's JSON-string arguments become the object transformers' templates expect (Qwen2.5's `tojson` would
    # otherwise train the model to write escaped JSON); text that is not a JSON object stays as written
    parsed = {**CALL, "function": {"name": "add", "arguments": {"a": 2, "b": 3}}}
    assert messages[1] == {"role": "assistant", "content": "", "tool_calls": [parsed]}
    for arguments in ("a=2", "[2, 3]", {"a": 2}):
        call = {"type": "function", "function": {"name": "add", "arguments": arguments}}
        assert normalize_messages([{"role": "assistant", "tool_calls": [call]}], 0)[0]["tool_calls"] == [call]
    # a columnar file fills each call's arguments with every call's names, None where it has none: not the call's;
    # a null written in a JSON string is the data's own
    for arguments, meant in (({"a": 2, "city": None}, {"a": 2}), ('{"a": 2, "unit": null}', {"a": 2, "unit": None})):
        call = {"type": "function", "function": {"name": "add", "arguments": arguments}}
        normalized = normalize_messages([{"role": "assistant", "tool_calls": [call]}], 0)[0]["tool_calls"]
        assert normalized == [{"type": "function", "function": {"name": "add", "arguments": meant}}]
    assert messages[2] == {"role": "tool", "content": "5", "name": "add", "tool_call_id": "call_0"}
    # a column read by `datasets` gives every message every key, None where a message has none
    filled = [{"role": "user", "content": "hi", "tool_calls": None, "name": None, "reasoning_content": None}]
    assert normalize_messages(filled, 0) == [{"role": "user", "content": "hi"}]
    # OpenAI's tool-calling reply may leave out its content altogether
    assert normalize_messages([{"role": "assistant", "tool_calls": [CALL]}], 0)[0]["content"] == ""


def test_a_tool_call_is_rendered_and_labelled_by_a_template_that_renders_tool_calls(tokenizer, tmp_path):
    template = tmp_path / "tools.jinja"
    template.write_text(TOOL_TEMPLATE)
    data = DataConfig(override_chat_template=str(template))
    path = write_rows(tmp_path / "tools.jsonl", [{"messages": TOOL_CONVERSATION}, {"messages": PLAIN}])
    dataset = SFTDataset(path, tokenizer, None, data, SFTConfig())
    assert len(dataset) == 2 and dataset.unusable_rows == []
    item = dataset[0]
    call = '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call><|im_end|>'
    assert labelled_text(tokenizer, item) == call + "It is 5.<|im_end|>"
    assert "<tool_response>\nadd: 5\n</tool_response>" in tokenizer.decode(item["input_ids"])


ADD_TOOL = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "Add two numbers.",
        "parameters": {"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}}},
    },
}


def test_a_rows_tools_are_shown_to_the_template_as_rl_shows_them_and_never_labelled(tokenizer, tmp_path, caplog):
    """TRL's tool-calling rows carry their tools in a `tools` column (a list, or a JSON string of one): the template
    lists them, as RL's prompt lists worker.rollout.multi_turn's tools, and only the replies are labelled."""
    from easyrl.data.sft import _warn_unread_tools
    from easyrl.data.template import ChatTemplate

    _warn_unread_tools.cache_clear()  # said once per process: this test wants to see it

    template = tmp_path / "tools.jinja"
    template.write_text(TOOL_TEMPLATE)
    data = DataConfig(override_chat_template=str(template))
    rows = [
        {"messages": TOOL_CONVERSATION, "tools": [ADD_TOOL]},
        {"messages": TOOL_CONVERSATION, "tools": json.dumps([ADD_TOOL])},
        {"messages": PLAIN},  # no tools: rendered without them
        {"messages": PLAIN, "tools": "[not json"},
    ]
    dataset = SFTDataset(write_rows(tmp_path / "tools.jsonl", rows), tokenizer, None, data, SFTConfig())
    assert [index for index, _ in dataset.unusable_rows] == [3]
    assert "sft.tools_key='tools' holds text that is not JSON" in dataset.unusable_rows[0][1]
    rl_prompt = ChatTemplate(tokenizer, None, str(template), tools=[ADD_TOOL])(TOOL_CONVERSATION[:1])
    for item in (dataset[0], dataset[1]):
        text = tokenizer.decode(item["input_ids"])
        assert text.startswith(rl_prompt)  # what RL shows before the first reply, tool list included
        assert text.count('"name": "add", "description": "Add two numbers."') == 1
        call = '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call><|im_end|>'
        assert labelled_text(tokenizer, item) == call + "It is 5.<|im_end|>"
    assert "<tools>" not in tokenizer.decode(dataset[2]["input_ids"])
    # parquet gives each tool the union of all tools' keys, None where it has none: those are not the tool's
    weather = {"type": "function", "function": {"name": "weather", "parameters": {"type": "object", "properties": {}}}}
    weather["function"]["parameters"]["properties"]["city"] = {"type": "string"}
    import pandas as pd

    columnar = tmp_path / "tools.parquet"
    pd.DataFrame([{"messages": TOOL_CONVERSATION, "tools": [ADD_TOOL, weather]}]).to_parquet(columnar)
    text = tokenizer.decode(SFTDataset(str(columnar), tokenizer, None, data, SFTConfig())[0]["input_ids"])
    assert "null" not in text and '"properties": {"city": {"type": "string"}}' in text
    # an RL prompt holding the same earlier turns (a call with JSON-string arguments) renders them as SFT did
    rl_rows = write_rows(tmp_path / "rl.jsonl", [{"prompt": TOOL_CONVERSATION[:3], "answer": "5"}])
    rl_text = tokenizer.decode(RLHFDataset(rl_rows, tokenizer, None, data)[0]["raw_prompt_ids"])
    sft_text = tokenizer.decode(dataset[0]["input_ids"])
    tools_block = sft_text[: sft_text.index("<|im_start|>user")]  # the RL rows here have no tools
    assert rl_text == sft_text[len(tools_block) : sft_text.index("It is 5.")]
    assert "does not read `tools`" not in caplog.text
    # a template that never reads `tools` (the tiny tokenizer's SmolLM2 one) trains without the list: said once
    with caplog.at_level("WARNING"):
        plain = SFTDataset(
            write_rows(tmp_path / "plain.jsonl", rows[2:3] * 2 + rows[:1]), tokenizer, None, DataConfig(), SFTConfig()
        )
    assert len(plain) == 2 and caplog.text.count("but the chat template does not read `tools`") == 1


def test_a_reply_that_renders_empty_is_skipped_and_named_once_with_its_rows(tokenizer, tmp_path, caplog):
    # the tiny tokenizer's SmolLM2 template ignores tool_calls: the tool-calling reply would be an empty answer
    rows = [
        {"messages": PLAIN},
        {"messages": TOOL_CONVERSATION},
        {"messages": TOOL_CONVERSATION},
        {"messages": [PLAIN[0], {"role": "assistant", "content": " "}]},
    ]
    with caplog.at_level("WARNING"):
        dataset = SFTDataset(write_rows(tmp_path / "rows.jsonl", rows), tokenizer, None, DataConfig(), SFTConfig())
    assert len(dataset) == 1 and labelled_text(tokenizer, dataset[0]) == "4<|im_end|>"
    assert [index for index, _ in dataset.unusable_rows] == [1, 2, 3]
    assert (
        "skipped 3 of 4 rows (rows 1, 2: assistant message 1 is empty (its tool_calls are not rendered by this chat "
        "template); row 3: assistant message 1 is empty (no content))."
    ) in caplog.text
    encoder = ConversationEncoder(tokenizer, None, DataConfig(), SFTConfig(), "test")
    assert labelled_text(tokenizer, encoder.encode({"messages": PLAIN})) == "4<|im_end|>"


def test_trl_prompt_completion_columns_are_refused_with_the_key_that_fits(tokenizer, tmp_path, caplog):
    path = write_rows(tmp_path / "trl.jsonl", [{"prompt": f"{i}+1?", "completion": str(i + 1)} for i in range(6)])
    with caplog.at_level("WARNING"), pytest.raises(ValueError) as error:
        SFTDataset(path, tokenizer, None, DataConfig(), SFTConfig())
    message = str(error.value)
    assert "columns are ['prompt', 'completion']" in message
    assert "Did you mean sft.response_key=completion?" in message
    assert "max_length" not in message and "no value for" not in caplog.text
    item = SFTDataset(path, tokenizer, None, DataConfig(), SFTConfig(response_key="completion"))[0]
    assert labelled_text(tokenizer, item) == "1<|im_end|>"

    sharegpt = write_rows(tmp_path / "sharegpt.jsonl", [{"conversations": PLAIN}])
    with pytest.raises(ValueError, match="Did you mean sft.messages_key=conversations\\?"):
        SFTDataset(sharegpt, tokenizer, None, DataConfig(), SFTConfig())


def test_no_usable_row_blames_max_length_only_when_rows_were_too_long(tokenizer, tmp_path):
    path = write_rows(tmp_path / "rows.jsonl", [{"messages": PLAIN[:1]}])
    with pytest.raises(ValueError) as error:
        SFTDataset(path, tokenizer, None, DataConfig(), SFTConfig())
    assert "max_length" not in str(error.value) and "no assistant message" in str(error.value)
    with pytest.raises(ValueError, match="usable conversation within sft.max_length=5 tokens"):
        SFTDataset(
            write_rows(tmp_path / "ok.jsonl", [{"messages": PLAIN}]),
            tokenizer,
            None,
            DataConfig(),
            SFTConfig(max_length=5),
        )


def test_messages_held_as_json_text_train_and_other_text_or_roles_are_named(tokenizer, tmp_path, caplog):
    """A CSV cell (or a column written with json.dumps) holds the messages as JSON text: it trains as the list does.
    Plain text read as "message 0 is not a {role, content} dict", and a reply under a role the template does not
    know as "no assistant message" without the role."""
    import csv

    path = tmp_path / "chats.csv"
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["messages"])
        writer.writerow([json.dumps(PLAIN)])
        writer.writerow(["What is 2+2? 4"])
        writer.writerow([json.dumps([PLAIN[0], {"role": "bot", "content": "4"}])])
    with caplog.at_level("WARNING"):
        dataset = SFTDataset(str(path), tokenizer, None, DataConfig(), SFTConfig())
    assert len(dataset) == 1 and labelled_text(tokenizer, dataset[0]) == "4<|im_end|>"
    assert dataset.unusable_rows == [
        (1, "sft.messages_key='messages' holds text, not a list of {role, content} messages (nor JSON text of one)"),
        (2, "the conversation has no assistant message (its roles: user, bot): nothing to learn"),
    ]


def test_sharegpt_conversations_train_like_chat_messages(tokenizer, tmp_path):
    """LLaMA-Factory's sharegpt format: {"from": "human" | "gpt" | "system", "value": ...}."""
    turns = [
        {"from": "system", "value": "Be brief."},
        {"from": "human", "value": "1+1?"},
        {"from": "gpt", "value": "2"},
    ]
    assert normalize_messages(turns, 0) == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "1+1?"},
        {"role": "assistant", "content": "2"},
    ]
    path = write_rows(tmp_path / "sharegpt.jsonl", [{"conversations": turns}])
    item = SFTDataset(path, tokenizer, None, DataConfig(), SFTConfig(messages_key="conversations"))[0]
    assert labelled_text(tokenizer, item) == "2<|im_end|>"


def test_an_assistant_message_of_weight_0_is_context_not_trained_on(tokenizer, tmp_path, caplog):
    """OpenAI's fine-tuning format: `"weight": 0` on an assistant message keeps it out of the loss."""
    bad_first = [
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "5", "weight": 0},
        {"role": "user", "content": "Sure?"},
        {"role": "assistant", "content": "4", "weight": 1},
    ]
    rows = [
        {"messages": bad_first},
        {"messages": [PLAIN[0], {**PLAIN[1], "weight": 0}]},
        {"messages": [PLAIN[0], {**PLAIN[1], "weight": 0.5}]},
        # an empty reply of weight 0 is context like any other, not a reason to skip the row
        {"messages": [PLAIN[0], {"role": "assistant", "content": "", "weight": 0}, *bad_first[2:]]},
    ]
    with caplog.at_level("WARNING"):
        dataset = SFTDataset(write_rows(tmp_path / "rows.jsonl", rows), tokenizer, None, DataConfig(), SFTConfig())
    assert len(dataset) == 2
    item = dataset[0]
    assert labelled_text(tokenizer, item) == "4<|im_end|>"
    assert "assistant\n5<|im_end|>" in tokenizer.decode(item["input_ids"])  # seen as context
    assert labelled_text(tokenizer, dataset[1]) == "4<|im_end|>"
    assert [index for index, _ in dataset.unusable_rows] == [1, 2]
    assert "row 1: every assistant message has weight 0: nothing to learn" in caplog.text
    assert "row 2: message 1 has weight 0.5: 0 (context, not trained on) or 1 (trained on)" in caplog.text


BOXED = "Q: {{ content }} Put the answer in \\boxed{}."
TWO_QUESTIONS = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "2+2?"},
    {"role": "assistant", "content": "4"},
    {"role": "user", "content": "and 3+3?"},
    {"role": "assistant", "content": "\\boxed{6}"},
]


def prompt_before_last_reply(tokenizer, item) -> str:
    """The tokens the model reads before its last labelled reply."""
    labelled = item["loss_mask"].tolist()
    start = max(i for i, (now, before) in enumerate(zip(labelled, [0, *labelled])) if now and not before)
    return tokenizer.decode(item["input_ids"][:start])


def test_format_prompt_renders_the_last_user_message_as_the_rl_prompt_does(tokenizer, tmp_path):
    template = tmp_path / "boxed.jinja"
    template.write_text(BOXED)
    data = DataConfig(prompt_key="prompt", format_prompt=str(template), filter_overlong_prompts=False)
    sharegpt = [
        {"from": {"system": "system", "user": "human", "assistant": "gpt"}[m["role"]], "value": m["content"]}
        for m in TWO_QUESTIONS
    ]
    rows = [{"messages": TWO_QUESTIONS}, {"messages": sharegpt}]
    dataset = SFTDataset(write_rows(tmp_path / "sft.jsonl", rows), tokenizer, None, data, SFTConfig())
    item = dataset[0]
    # the last question reads as the RL prompt holding these turns shows it; earlier turns as they were written
    rl_rows = write_rows(tmp_path / "rl.jsonl", [{"prompt": TWO_QUESTIONS[:4], "answer": "6"}])
    rl_prompt = tokenizer.decode(RLHFDataset(rl_rows, tokenizer, None, data)[0]["raw_prompt_ids"])
    assert prompt_before_last_reply(tokenizer, item) == rl_prompt
    assert "<|im_start|>user\nQ: and 3+3? Put the answer in \\boxed{}.<|im_end|>" in rl_prompt
    assert "<|im_start|>user\n2+2?<|im_end|>" in rl_prompt
    assert labelled_text(tokenizer, item) == "4<|im_end|>\\boxed{6}<|im_end|>"
    # ShareGPT's conversations, and the same turns as TRL's prompt and completion columns, train the same tokens
    encoder = ConversationEncoder(tokenizer, None, data, SFTConfig(response_key="completion"), "test")
    split = encoder.encode({"prompt": TWO_QUESTIONS[:4], "completion": TWO_QUESTIONS[4:]})
    for other in (dataset[1], split):
        assert other["input_ids"].tolist() == item["input_ids"].tolist()
        assert other["loss_mask"].tolist() == item["loss_mask"].tolist()


def test_format_prompt_keeps_a_picture_where_its_placeholder_or_part_puts_it(tokenizer, tmp_path):
    template = tmp_path / "brief.jinja"
    template.write_text("Look: {{ content }} Be brief.")
    encoder = ConversationEncoder(tokenizer, None, DataConfig(format_prompt=str(template)), SFTConfig(), "test")
    reply = {"role": "assistant", "content": "2"}
    # the template renders the text with its placeholder, as RL renders it, and the placeholder then becomes a part
    placeholder = encoder.messages({"messages": [{"role": "user", "content": "<image>How many?"}, reply]}, 1, 0)
    assert placeholder[0]["content"] == [
        {"type": "text", "text": "Look: "},
        {"type": "image"},
        {"type": "text", "text": "How many? Be brief."},
    ]
    # typed parts: the template renders the last text part, the picture part stays first
    parts = [{"type": "image", "image": "cat.png", "text": None}, {"type": "text", "text": "How many?", "image": None}]
    typed = encoder.messages({"messages": [{"role": "user", "content": parts}, reply]}, 1, 0)
    assert typed[0]["content"] == [{"type": "image"}, {"type": "text", "text": "Look: How many? Be brief."}]
    assert typed[1] == reply and parts[1]["text"] == "How many?"  # the row's own value is not changed
    # no placeholder and no part: the picture goes before the formatted text
    plain = encoder.messages({"messages": [{"role": "user", "content": "How many?"}, reply]}, 1, 0)
    assert plain[0]["content"] == [{"type": "image"}, {"type": "text", "text": "Look: How many? Be brief."}]


def test_a_formatted_question_with_a_picture_reads_as_the_rl_prompt_does(
    vl_tokenizer_and_processor, tiny_vl_model_path, tmp_path
):
    from PIL import Image
    from transformers import AutoConfig

    tokenizer, processor = vl_tokenizer_and_processor
    Image.new("RGB", (56, 56), (255, 0, 0)).save(tmp_path / "red.png")
    template = tmp_path / "brief.jinja"
    template.write_text("Look: {{ content }} Be brief.")
    data = DataConfig(prompt_key="prompt", format_prompt=str(template), min_pixels=28 * 28, max_pixels=56 * 56)
    conversation = [{"role": "user", "content": "<image>How many?"}, {"role": "assistant", "content": "1"}]
    model_config = AutoConfig.from_pretrained(tiny_vl_model_path)
    sft_rows = write_rows(tmp_path / "sft.jsonl", [{"messages": conversation, "images": ["red.png"]}])
    item = SFTDataset(sft_rows, tokenizer, processor, data, SFTConfig(), model_config=model_config)[0]
    rl_rows = write_rows(tmp_path / "rl.jsonl", [{"prompt": conversation[:1], "images": ["red.png"], "answer": "1"}])
    rl_item = RLHFDataset(rl_rows, tokenizer, processor, data, model_config=model_config)[0]
    # RL's raw prompt holds one pad per picture (the engine expands it); SFT's the picture's 4 (2x2 merged patches)
    pad = "<|image_pad|>"
    assert int((item["input_ids"] == processor.image_token_id).sum()) == 4
    rl_prompt = tokenizer.decode(rl_item["raw_prompt_ids"])
    assert prompt_before_last_reply(tokenizer, item).replace(pad * 4, pad) == rl_prompt
    assert f"Look: <|vision_start|>{pad}<|vision_end|>How many? Be brief.<|im_end|>" in rl_prompt
    assert labelled_text(tokenizer, item) == "1<|im_end|>"
