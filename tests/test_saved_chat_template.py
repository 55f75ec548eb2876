"""A run with data.override_chat_template saves that template with its tokenizer (and a vision-language model's
processor): a checkpoint's `huggingface/` folder and its `easyrl merge` copy render chats as training rendered them.
The SFT run in tests/test_sft.py checks the same of the folders its workers write."""

import pytest
import torch

import easyrl  # noqa: F401  (torchvision shim before the Qwen-VL processors import it)
from easyrl.data.template import ChatTemplate


MARKER = "<<override>>"
# a template no model ships: every message between markers, and the generation prompt after them
OVERRIDE = (
    MARKER + "{% for message in messages %}[{{ message.role }}]"
    "{% if message.content is string %}{{ message.content }}{% else %}"
    "{% for part in message.content %}{% if part.type == 'text' %}{{ part.text }}{% else %}<{{ part.type }}>"
    "{% endif %}{% endfor %}{% endif %}{% endfor %}{% if add_generation_prompt %}[assistant]{% endif %}\n"
)
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"}]
PICTURE_MESSAGES = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What shape?"}]}]


@pytest.fixture
def override_file(tmp_path):
    path = tmp_path / "override.jinja"
    path.write_text(OVERRIDE)
    return str(path)


def test_the_tokenizer_of_a_run_with_an_override_holds_the_override(tiny_model_path, override_file):
    from easyrl.data.tokenizer import load_tokenizer_and_processor

    tokenizer, processor = load_tokenizer_and_processor(str(tiny_model_path), chat_template=override_file)
    assert processor is None
    assert tokenizer.chat_template == OVERRIDE
    assert tokenizer.apply_chat_template(MESSAGES, tokenize=False) == MARKER + "[system]Be brief.[user]2+2?"


def test_a_checkpoint_and_its_merge_render_prompts_as_training_rendered_them(tiny_model_path, override_file, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from easyrl.data.tokenizer import load_tokenizer_and_processor
    from easyrl.trainer.merge import merge_checkpoint
    from easyrl.workers.fsdp_checkpoint import save_role_checkpoint

    tokenizer, processor = load_tokenizer_and_processor(str(tiny_model_path), chat_template=override_file)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32)
    role = tmp_path / "global_step_1" / "actor"
    save_role_checkpoint(str(role), model, None, None, tokenizer=tokenizer, processor=processor)
    merged = merge_checkpoint(str(role), str(tmp_path / "merged"))

    own_tokenizer, _ = load_tokenizer_and_processor(str(tiny_model_path))
    trained_on = ChatTemplate(own_tokenizer, None, override_file)(MESSAGES)
    assert trained_on == MARKER + "[system]Be brief.[user]2+2?[assistant]"
    for folder in (role / "huggingface", merged):
        saved = AutoTokenizer.from_pretrained(folder)
        assert saved.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True) == trained_on


def test_a_vision_language_folder_renders_the_override_in_its_processor_and_its_tokenizer(
    tiny_vl_model_path, override_file, tmp_path
):
    from transformers import AutoModelForImageTextToText, AutoProcessor, AutoTokenizer

    from easyrl.data.tokenizer import load_tokenizer_and_processor
    from easyrl.workers.fsdp_checkpoint import save_config_folder

    tokenizer, processor = load_tokenizer_and_processor(str(tiny_vl_model_path), chat_template=override_file)
    model = AutoModelForImageTextToText.from_pretrained(tiny_vl_model_path, dtype=torch.float32)
    save_config_folder(str(tmp_path / "huggingface"), model, tokenizer, processor)

    own_tokenizer, own_processor = load_tokenizer_and_processor(str(tiny_vl_model_path))
    trained_on = ChatTemplate(own_tokenizer, own_processor, override_file)(PICTURE_MESSAGES)
    assert trained_on == MARKER + "[user]<image>What shape?[assistant]"
    saved_processor = AutoProcessor.from_pretrained(tmp_path / "huggingface")
    assert (
        saved_processor.apply_chat_template(PICTURE_MESSAGES, tokenize=False, add_generation_prompt=True) == trained_on
    )
    saved_tokenizer = AutoTokenizer.from_pretrained(tmp_path / "huggingface")
    assert saved_tokenizer.apply_chat_template(MESSAGES, tokenize=False) == MARKER + "[system]Be brief.[user]2+2?"
