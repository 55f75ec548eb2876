"""The tokenizer and (for vision-language models) the processor of a model folder or hub id."""

import logging
from typing import Any

from ..utils.remote_code import RemoteCodeRefusedError, naming_the_remote_code_key


logger = logging.getLogger(__name__)


def load_tokenizer_and_processor(path: str, trust_remote_code: bool = False) -> tuple[Any, Any]:
    """(tokenizer, processor); processor is None for text-only models. A tokenizer without a pad token pads with
    its eos token (prompts are left-padded and masked, so the pad id never reaches the model). A checkpoint whose
    tokenizer or processor needs its own code raises RemoteCodeRefusedError unless ``trust_remote_code``."""
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
    return tokenizer, processor
