"""Tools advertised through the chat template (`tools=`), and validation samples that show the whole multi-turn
response (the tool results included)."""

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch

from easyrl.data.template import ChatTemplate
from easyrl.workers.tool_files import tool_schemas


CALCULATOR = str(Path(__file__).resolve().parent.parent / "tools" / "calculator.py")
# a template that lists the tools it is given, as Qwen2.5/Qwen3's do in their system block
TOOL_TEMPLATE = (
    "{% if tools %}TOOLS:{% for tool in tools %} {{ tool.function.name }}({{ tool.function.parameters.required "
    "| join(',') }}){% endfor %}\n{% endif %}{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}"
)


def test_the_chat_template_advertises_the_tools_where_it_reads_them(tokenizer, tmp_path):
    schemas = tool_schemas(CALCULATOR)
    assert schemas[0]["function"]["name"] == "calculator"
    assert schemas[0]["function"]["parameters"]["required"] == ["expression"]
    template_file = tmp_path / "tools.jinja"
    template_file.write_text(TOOL_TEMPLATE)
    messages = [{"role": "user", "content": "2+3?"}]
    # (transformers renders templates with trim_blocks: the newline after `{% endif %}` goes)
    assert ChatTemplate(tokenizer, None, str(template_file), schemas)(messages) == (
        "TOOLS: calculator(expression)<user>2+3?<assistant>"
    )
    assert ChatTemplate(tokenizer, None, str(template_file))(messages) == "<user>2+3?<assistant>"
    # SmolLM2's own template reads no tools: the prompt is the same with or without them
    assert ChatTemplate(tokenizer, None, None, schemas)(messages) == ChatTemplate(tokenizer)(messages)


def test_validation_samples_decode_the_whole_attended_response(tokenizer):
    from easyrl.protocol import DataProto
    from easyrl.trainer.ray_trainer import PPOTrainer

    encode = lambda text: tokenizer.encode(text, add_special_tokens=False)  # noqa: E731
    # the prompt as a chat template writes it: its turns end in <|im_end|>, SmolLM2's pad token too
    prompt = encode("<|im_start|>user\nWhat is 3+4?<|im_end|>\n<|im_start|>assistant\n")
    assert tokenizer.pad_token_id in prompt
    call, tool, answer = encode("call"), encode("\n<|im_start|>tool\n7<|im_end|>\n"), encode("It is 7.")
    response = call + tool + answer
    width = len(response) + 2
    pad = tokenizer.pad_token_id
    responses = torch.tensor([response + [pad] * 2])
    prompts = torch.tensor([[pad] * 3 + prompt])  # left-padded
    model = torch.tensor([[1] * len(call) + [0] * len(tool) + [1] * len(answer) + [0] * 2])
    attention = torch.tensor([[0] * 3 + [1] * len(prompt) + [1] * len(response) + [0] * 2])
    batch = DataProto.from_dict(
        tensors={"prompts": prompts, "responses": responses, "response_mask": model, "attention_mask": attention},
        non_tensors={"ground_truth": np.array(["7"], dtype=object)},
    )
    assert responses.shape[-1] == width
    (sample,) = PPOTrainer._decode_samples(SimpleNamespace(global_step=2, tokenizer=tokenizer), batch, [1.0])
    assert sample["response"] == "call\ntool\n7\nIt is 7."  # the tool's result too, special tokens dropped
    assert sample["prompt"] == "<|im_start|>user\nWhat is 3+4?<|im_end|>\n<|im_start|>assistant\n"
    assert sample["score"] == 1.0 and sample["step"] == 2
    # a vision-language prompt: the actor's copy expands each picture's pad to its vision tokens, the engine's
    # (raw_prompt_ids) holds one pad a picture; the logged prompt is the engine's, as `easyrl generate` writes it
    engine_prompt = encode("<|im_start|>user\n<pad>What is 3+4?<|im_end|>\n<|im_start|>assistant\n")
    expanded = encode("<|im_start|>user\n<pad><pad><pad><pad>What is 3+4?<|im_end|>\n<|im_start|>assistant\n")
    raw = np.empty(1, dtype=object)  # an object array of token lists, as the dataset's raw_prompt_ids
    raw[0] = engine_prompt
    vl = DataProto.from_dict(
        tensors={
            "prompts": torch.tensor([expanded]),
            "responses": torch.tensor([answer]),
            "response_mask": torch.ones(1, len(answer), dtype=torch.long),
            "attention_mask": torch.ones(1, len(expanded) + len(answer), dtype=torch.long),
        },
        non_tensors={
            "ground_truth": np.array(["7"], dtype=object),
            "raw_prompt_ids": raw,
        },
    )
    (sample,) = PPOTrainer._decode_samples(SimpleNamespace(global_step=2, tokenizer=tokenizer), vl, [1.0])
    assert sample["prompt"] == "<|im_start|>user\n<pad>What is 3+4?<|im_end|>\n<|im_start|>assistant\n"


# ChatML with the tool role written as `observation`: a template a user gives in data.override_chat_template
OBSERVATION_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ 'observation' if m.role == 'tool' else m.role }}\n{{ m.content }}"
    "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def test_tool_results_render_with_the_override_chat_template_the_prompts_used(tokenizer, tmp_path, valid_args):
    """data.override_chat_template reaches the multi-turn rollout (worker.rollout.multi_turn.chat_template): tool
    results and a tool environment's reset text are rendered with the template the prompts were rendered with, not
    the model's own (SmolLM2's writes `tool`)."""
    from easyrl.config import load_config
    from easyrl.workers.rollout.multi_turn import MultiTurnRollout, ToolCall, ToolMessageRenderer, ToolResult
    from tests.test_multi_turn import scripted_engine

    template = tmp_path / "observation.jinja"
    template.write_text(OBSERVATION_TEMPLATE)
    config = load_config(
        [*valid_args, f"data.override_chat_template={template}", f"worker.rollout.multi_turn.tools={CALCULATOR}"]
    )
    assert config.worker.rollout.multi_turn.chat_template == str(template)
    stop = "<|im_end|>"
    calls, results = [ToolCall("calculator", {"expression": "3+4"})], [ToolResult("7")]
    own = ToolMessageRenderer(tokenizer)
    overridden = ToolMessageRenderer(tokenizer, chat_template=str(template))
    decode = tokenizer.decode
    assert (
        decode(own.token_ids(own.messages(calls, results), stop))
        == "\n<|im_start|>tool\n7<|im_end|>\n<|im_start|>assistant\n"
    )
    assert decode(overridden.token_ids(overridden.messages(calls, results), stop)) == (
        "\n<|im_start|>observation\n7<|im_end|>\n<|im_start|>assistant\n"
    )
    engine, _ = scripted_engine(tokenizer, {}, 16)
    rollout = MultiTurnRollout(engine, config.worker.rollout.multi_turn)
    assert rollout.renderer.chat_template.template == OBSERVATION_TEMPLATE


def test_tools_a_template_does_not_list_are_named_in_a_warning_unless_the_users_prompts_name_them(
    tokenizer, tmp_path, caplog
):
    import json

    from easyrl.data import template as template_module
    from easyrl.data.dataset import RLHFDataset
    from tests.test_bad_data import data_config

    schemas = tool_schemas(CALCULATOR)
    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps({"problem": "2+3?", "answer": "5"}) + "\n")
    listing = tmp_path / "tools.jinja"
    listing.write_text(TOOL_TEMPLATE)
    naming = tmp_path / "format.jinja"
    naming.write_text('{{ content }} Call <tool_call>{"name": "calculator", ...}</tool_call>.')
    warning = "The chat template does not read `tools`, so the model is not shown the tools of"

    def warned(**overrides) -> bool:
        template_module._warn_unshown_tools.cache_clear()
        caplog.clear()
        RLHFDataset(str(path), tokenizer, None, data_config(max_prompt_length=128, **overrides), tools=schemas)
        return warning in caplog.text

    # SmolLM2's template reads no tools and nothing else names the calculator
    assert warned()
    assert "(calculator), and neither data.format_prompt nor the first row's prompt names them" in caplog.text
    assert not warned(override_chat_template=str(listing))  # a template that lists them
    assert not warned(format_prompt=str(naming))  # the user's prompt template describes it

    # a tool's name inside another word is not the prompt naming it: "calc" is not in "calculator"
    calc = {"type": "function", "function": {"name": "calc", "description": "Add.", "parameters": {}}}
    template_module._warn_unshown_tools.cache_clear()
    caplog.clear()
    RLHFDataset(
        str(path),
        tokenizer,
        None,
        data_config(max_prompt_length=128, format_prompt=str(naming)),
        tools=[*schemas, calc],
    )
    assert "(calc), and neither data.format_prompt nor the first row's prompt names them" in caplog.text
