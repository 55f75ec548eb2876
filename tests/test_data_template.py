"""Prompt building: Jinja prompt file, placeholders for images/videos, chat template override."""

import pytest

from easyrl.data.template import ChatTemplate, PromptFormatter, build_messages


def test_format_prompt_file_wraps_the_content(tmp_path):
    path = tmp_path / "math.jinja"
    path.write_text("{{ content | trim }} Answer in \\boxed{}.\n")
    assert PromptFormatter(str(path))("  What is 2+2? ") == "What is 2+2? Answer in \\boxed{}."


def test_a_template_that_never_shows_the_question_or_reads_other_variables_is_named(tmp_path, caplog):
    ignores = tmp_path / "ignores.jinja"
    ignores.write_text("Just say hi.")
    other = tmp_path / "other.jinja"
    other.write_text("{{ question }} {{ content }}")
    with caplog.at_level("WARNING"):
        assert PromptFormatter(str(ignores))("What is 2+2?") == "Just say hi."
        assert PromptFormatter(str(other))("2+2?") == " 2+2?"
    assert f"{ignores} never uses {{{{ content }}}}: every prompt is the template's own text" in caplog.text
    assert f"{other} uses `question`" in caplog.text and f"{other} never uses" not in caplog.text


def test_no_format_prompt_keeps_the_text():
    assert PromptFormatter(None)("hi") == "hi"


def test_missing_template_file_names_key_and_file(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"data.format_prompt: template file '.*missing.jinja' does not exist"):
        PromptFormatter(str(tmp_path / "missing.jinja"))


def test_template_syntax_error_names_file_and_line(tmp_path):
    path = tmp_path / "broken.jinja"
    path.write_text("line one\n{{ content ")
    with pytest.raises(ValueError, match=r"broken.jinja' line 2"):
        PromptFormatter(str(path))


def test_template_syntax_error_line_counts_the_stripped_blank_lines(tmp_path):
    path = tmp_path / "broken.jinja"
    path.write_text("\n\nline three\n{{ content ")
    with pytest.raises(ValueError, match=r"broken.jinja' line 4"):
        PromptFormatter(str(path))


def test_placeholders_place_images_and_videos():
    messages = build_messages("Compare <image> with <image>, then <video>.", num_images=2, num_videos=1)
    types = [part["type"] for part in messages[0]["content"]]
    assert types == ["text", "image", "text", "image", "text", "video", "text"]


def test_rows_without_placeholders_get_media_before_the_text():
    parts = build_messages("How many?", num_images=2)[0]["content"]
    assert parts == [{"type": "image"}, {"type": "image"}, {"type": "text", "text": "How many?"}]


def test_text_only_rows_are_plain_strings():
    assert build_messages("hello") == [{"role": "user", "content": "hello"}]


def test_placeholder_count_must_match_the_media():
    with pytest.raises(ValueError, match="1 <image> and 0 <video> placeholders but the row has 2 images"):
        build_messages("look <image>", num_images=2)


def test_content_given_as_text_parts_renders_with_a_text_models_template(tmp_path, tokenizer):
    """OpenAI's and TRL's content parts ([{"type": "text", "text": ...}]) crashed SmolLM2's template, which adds the
    content to a string, at the first measurement of the prompts: text parts alone are the one string they spell."""
    from easyrl.data.template import PromptFormatter, conversation_messages

    fmt = tmp_path / "fmt.jinja"
    fmt.write_text("{{ content }} Put the answer in \\boxed{}.")
    conversation = [
        {"role": "system", "content": [{"type": "text", "text": "Be brief."}]},
        {"role": "user", "content": [{"type": "text", "text": "What is 2 + 3?"}, {"type": "text", "text": " Think."}]},
    ]
    messages = conversation_messages(conversation, PromptFormatter(str(fmt)))
    assert messages == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is 2 + 3? Think. Put the answer in \\boxed{}."},
    ]
    assert ChatTemplate(tokenizer)(messages).endswith(
        "<|im_start|>user\nWhat is 2 + 3? Think. Put the answer in \\boxed{}.<|im_end|>\n<|im_start|>assistant\n"
    )
    # a picture among the parts keeps them a list, for the model's processor
    pictured = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "How many?"}]}]
    assert conversation_messages(pictured, PromptFormatter(None), num_images=1)[0]["content"] == [
        {"type": "image"},
        {"type": "text", "text": "How many?"},
    ]


def test_override_chat_template_file(tmp_path, tokenizer):
    path = tmp_path / "chat.jinja"
    path.write_text("{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}[assistant]")
    rendered = ChatTemplate(tokenizer, None, str(path))(build_messages("2+2?"))
    assert rendered == "[user] 2+2?\n[assistant]"


def test_tokenizer_chat_template_is_the_default(tokenizer):
    rendered = ChatTemplate(tokenizer)(build_messages("2+2?"))
    assert rendered.endswith("<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n")


def test_chat_message_prompts_keep_their_turns_and_place_media():
    from easyrl.data.template import PromptFormatter, conversation_messages

    conversation = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "<image> What is this?"},
        {"role": "assistant", "content": "A dot."},
        {"role": "user", "content": "How many?"},
    ]
    messages = conversation_messages(conversation, PromptFormatter(None), num_images=1)
    assert messages[0] == {"role": "system", "content": "Be brief."} and messages[3]["content"] == "How many?"
    assert messages[1]["content"] == [{"type": "image"}, {"type": "text", "text": " What is this?"}]
    assert conversation[1]["content"] == "<image> What is this?"  # the row's own value is not changed
    # without placeholders the pictures go before the text of the first user message
    plain = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "How many?"}]
    assert conversation_messages(plain, PromptFormatter(None), num_images=2)[1]["content"] == [
        {"type": "image"},
        {"type": "image"},
        {"type": "text", "text": "How many?"},
    ]
    with pytest.raises(ValueError, match="hold no `user` message"):
        conversation_messages([{"role": "system", "content": "x"}], PromptFormatter(None))
    with pytest.raises(ValueError, match="must be chat messages .* item 0 is"):  # content parts must be dicts
        conversation_messages([{"role": "user", "content": ["a", "b"]}], PromptFormatter(None))
    with pytest.raises(ValueError, match="1 <image> and 0 <video> placeholders but the row has 2 images"):
        conversation_messages(conversation, PromptFormatter(None), num_images=2)


def test_a_placeholder_in_another_case_is_said_and_left_as_text(caplog):
    """`<IMAGE>` is no placeholder: the picture goes before the text, silently, with `<IMAGE>` left in it."""
    from easyrl.data.template import _warn_other_case_placeholder, place_media

    _warn_other_case_placeholder.cache_clear()
    messages = [{"role": "user", "content": "<IMAGE> How many dots?"}]
    with caplog.at_level("WARNING", logger="easyrl.data.template"):
        placed = place_media(messages, 1, 0)
        place_media([{"role": "user", "content": "<IMAGE> again"}], 1, 0)  # said once
    assert placed[0]["content"] == [{"type": "image"}, {"type": "text", "text": "<IMAGE> How many dots?"}]
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 1 and warned[0].startswith("A prompt holds `<IMAGE>`, which is no placeholder")
    caplog.clear()
    with caplog.at_level("WARNING", logger="easyrl.data.template"):  # the lower-case one is a placeholder
        place_media([{"role": "user", "content": "<image> How many?"}], 1, 0)
    assert not caplog.records
