"""data.apply_chat_template_kwargs (verl's key; TRL's chat_template_kwargs): variables every rendering hands the chat
template, e.g. Qwen3's enable_thinking. The prompts, the turns of a multi-turn rollout and SFT conversations render
with the same variables; an argument of the rendering itself is refused naming the key."""

import json

import pytest

from easyrl.config import ConfigError, load_config
from easyrl.data.template import ChatTemplate
from easyrl.workers.rollout.multi_turn import ToolCall, ToolMessageRenderer, ToolResult


# ChatML with Qwen3's switch: enable_thinking=false opens the reply with an empty think block; a final assistant
# message without reasoning is rendered after an empty think block either way (as Qwen3's template does)
QWEN3_LIKE = (
    "{%- for m in messages %}{%- if m.role == 'assistant' %}"
    "{{- '<|im_start|>assistant\\n<think>\\n\\n</think>\\n\\n' + m.content + '<|im_end|>\\n' }}"
    "{%- else %}{{- '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}"
    "{%- endif %}"
)
NO_THINK = "<|im_start|>assistant\n<think>\n\n</think>\n\n"


@pytest.fixture
def template_file(tmp_path):
    path = tmp_path / "qwen3_like.jinja"
    path.write_text(QWEN3_LIKE)
    return str(path)


def test_prompts_render_with_the_variables(tokenizer, template_file):
    messages = [{"role": "user", "content": "2+3?"}]
    off = ChatTemplate(tokenizer, None, template_file, template_kwargs={"enable_thinking": False})(messages)
    assert off == "<|im_start|>user\n2+3?<|im_end|>\n" + NO_THINK
    assert ChatTemplate(tokenizer, None, template_file)(messages).endswith("<|im_start|>assistant\n")
    on = ChatTemplate(tokenizer, None, template_file, template_kwargs={"enable_thinking": True})(messages)
    assert on.endswith("<|im_start|>assistant\n")


def test_the_dataset_the_rollout_turns_and_sft_render_with_the_same_variables(tokenizer, template_file, tmp_path):
    from easyrl.config.schema import DataConfig, SFTConfig
    from easyrl.data.dataset import RLHFDataset
    from easyrl.data.sft import SFTDataset

    data_file = tmp_path / "rows.jsonl"
    data_file.write_text(json.dumps({"prompt": "2+3?", "answer": "5", "response": "5"}) + "\n")
    config = DataConfig(
        prompt_key="prompt",
        answer_key="answer",
        override_chat_template=template_file,
        apply_chat_template_kwargs={"enable_thinking": False},
    )
    prompt_ids = RLHFDataset(str(data_file), tokenizer, None, config)[0]["raw_prompt_ids"]
    assert tokenizer.decode(prompt_ids) == "<|im_start|>user\n2+3?<|im_end|>\n" + NO_THINK

    renderer = ToolMessageRenderer(
        tokenizer, chat_template=template_file, template_kwargs=config.apply_chat_template_kwargs
    )
    tool_turn = renderer.token_ids(renderer.messages([ToolCall("add", {})], [ToolResult("5")]), "<|im_end|>")
    assert tokenizer.decode(tool_turn) == "\n<|im_start|>tool\n5<|im_end|>\n" + NO_THINK
    assert tokenizer.decode(renderer.user_turn_end()) == "<|im_end|>\n" + NO_THINK
    plain = ToolMessageRenderer(tokenizer, chat_template=template_file)
    assert tokenizer.decode(plain.user_turn_end()) == "<|im_end|>\n<|im_start|>assistant\n"

    # SFT: the empty think block is part of the prompt with thinking off, of the labelled reply without the variable
    sft = SFTConfig(response_key="response")
    item = SFTDataset(str(data_file), tokenizer, None, config, sft)[0]
    assert tokenizer.decode(item["input_ids"]) == "<|im_start|>user\n2+3?<|im_end|>\n" + NO_THINK + "5<|im_end|>\n"
    assert tokenizer.decode(item["input_ids"][item["loss_mask"].bool()]) == "5<|im_end|>"
    config.apply_chat_template_kwargs = {}
    item = SFTDataset(str(data_file), tokenizer, None, config, sft)[0]
    assert tokenizer.decode(item["input_ids"][item["loss_mask"].bool()]) == "<think>\n\n</think>\n\n5<|im_end|>"


def test_the_key_is_copied_to_the_turns_and_rendering_arguments_are_refused(valid_args):
    config = load_config([*valid_args, "+data.apply_chat_template_kwargs.enable_thinking=False"])
    assert config.data.apply_chat_template_kwargs == {"enable_thinking": False}
    assert config.worker.rollout.multi_turn.chat_template_kwargs == {"enable_thinking": False}
    with pytest.raises(ConfigError, match=r"`data.apply_chat_template_kwargs.tools`.*worker.rollout.multi_turn.tools"):
        load_config([*valid_args, "data.apply_chat_template_kwargs.tools=[]"])
    with pytest.raises(ConfigError, match=r"`data.apply_chat_template_kwargs.add_generation_prompt`.*remove it"):
        load_config([*valid_args, "data.apply_chat_template_kwargs={add_generation_prompt: false}"])
    with pytest.raises(ConfigError, match="template variables are names like enable_thinking"):
        load_config([*valid_args, "data.apply_chat_template_kwargs={'enable thinking': false}"])
    with pytest.raises(ConfigError, match="derived"):
        load_config([*valid_args, "worker.rollout.multi_turn.chat_template_kwargs={a: 1}"])


def test_a_variable_the_template_never_reads_is_said_once(tokenizer, template_file, caplog):
    messages = [{"role": "user", "content": "2+3?"}]
    with caplog.at_level("WARNING", logger="easyrl.data.template"):
        ChatTemplate(tokenizer, None, None, template_kwargs={"reasoning_depth": 2})(messages)  # SmolLM2's reads none
        ChatTemplate(tokenizer, None, None, template_kwargs={"reasoning_depth": 2})(messages)
        ChatTemplate(tokenizer, None, template_file, template_kwargs={"enable_thinking": False})(messages)
    warned = [r.getMessage() for r in caplog.records if "apply_chat_template_kwargs" in r.getMessage()]
    assert len(warned) == 1 and "reads no `reasoning_depth`, so setting it changes nothing" in warned[0], warned


def test_templates_with_transformers_generation_blocks_are_read():
    """A training template's `{% generation %}` block (transformers' tag) is read for its variables too."""
    import jinja2.meta

    from easyrl.data.template import _CHAT_ENVIRONMENT

    source = QWEN3_LIKE.replace("+ m.content +", "+ '' }}{% generation %}{{ m.content }}{% endgeneration %}{{ ''")
    variables = jinja2.meta.find_undeclared_variables(_CHAT_ENVIRONMENT.parse(source))
    assert {"messages", "add_generation_prompt", "enable_thinking"} <= variables
