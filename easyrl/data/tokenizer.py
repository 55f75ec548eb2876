"""The tokenizer and (for vision-language models) the processor of a model folder or hub id."""

import json
import logging
from pathlib import Path
from typing import Any

from ..utils.remote_code import RemoteCodeRefusedError, naming_the_remote_code_key
from .template import read_template_file


logger = logging.getLogger(__name__)

# where AutoTokenizer reads a folder's chat template from (a processor's chat_template.json is not the tokenizer's)
CHAT_TEMPLATE_PLACES = "a chat_template.jinja, or `chat_template` in its tokenizer_config.json"


def has_chat_template(tokenizer: Any) -> bool:
    """Whether a loaded tokenizer can write a chat (the condition the workers check)."""
    return getattr(tokenizer, "chat_template", None) is not None


def folder_has_chat_template(path: str) -> bool | None:
    """`has_chat_template` of the tokenizer a local model folder would load, read from its files alone (for `easyrl
    check`: no transformers, no torch): its chat_template.jinja, or a `chat_template` in its tokenizer_config.json.
    None for a hub id, a built-in model or a folder without a tokenizer_config.json (the loader names those)."""
    folder = Path(path).expanduser()
    config_file = folder / "tokenizer_config.json"
    if not config_file.is_file():
        return None
    if (folder / "chat_template.jinja").is_file():
        return True
    try:
        tokenizer_config = json.loads(config_file.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None  # the loader names a file it cannot read
    return isinstance(tokenizer_config, dict) and tokenizer_config.get("chat_template") is not None


def load_tokenizer_and_processor(
    path: str, trust_remote_code: bool = False, chat_template: str | None = None
) -> tuple[Any, Any]:
    """(tokenizer, processor); processor is None for text-only models. A tokenizer without a pad token pads with
    its eos token (prompts are left-padded and masked, so the pad id never reaches the model). A checkpoint whose
    tokenizer or processor needs its own code raises RemoteCodeRefusedError unless ``trust_remote_code``.

    ``chat_template``: a run's data.override_chat_template file; the tokenizer and the processor hold its text in
    place of the model's own template, so every Hugging Face folder they are saved into (checkpoints, the SFT output,
    `easyrl merge`'s copy of a checkpoint's) renders chats as the run rendered them."""
    from transformers import AutoProcessor, AutoTokenizer

    with naming_the_remote_code_key(path):
        tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    processor = None
    try:
        with naming_the_remote_code_key(path):
            processor = AutoProcessor.from_pretrained(path, trust_remote_code=trust_remote_code)
    except RemoteCodeRefusedError:
        raise  # not a text-only model: a processor that needs its code
    except (OSError, ValueError, TypeError, KeyError) as error:
        logger.debug("No processor for %s (%s): text-only model.", path, error)
    # AutoProcessor falls back to the tokenizer for text-only models: that is not a multimodal processor.
    if processor is not None and not hasattr(processor, "image_processor"):
        processor = None
    if processor is not None:
        processor.tokenizer = tokenizer  # one tokenizer object: the same pad token everywhere
    if chat_template:
        # both: transformers saves each one's template to the folder's chat_template.jinja, and a vision-language
        # model renders with its processor's (easyrl.data.template.ChatTemplate)
        text = read_template_file(chat_template, "data.override_chat_template")
        for holder in (tokenizer, processor):
            if holder is not None:
                holder.chat_template = text
    return tokenizer, processor
