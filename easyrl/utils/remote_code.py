"""Checkpoints that ship their own Python code (``auto_map`` in config.json / tokenizer_config.json) load only with
``worker.<role>.model.trust_remote_code=true``: that code runs in the driver and in every worker process, so easyrl
runs it only when asked to (EasyR1 runs it by default)."""

from collections.abc import Iterator
from contextlib import contextmanager


class RemoteCodeRefusedError(ValueError):
    """A checkpoint needs its own code and the config does not allow it; the message names the key to set."""


@contextmanager
def naming_the_remote_code_key(path: str, role: str = "actor") -> Iterator[None]:
    """Turn transformers' refusal to run a checkpoint's code (a ValueError that mentions trust_remote_code) into an
    error that names the config key allowing it."""
    try:
        yield
    except RemoteCodeRefusedError:
        raise
    except ValueError as error:
        if "trust_remote_code" not in str(error):
            raise
        raise RemoteCodeRefusedError(
            f"{path} ships its own model code (auto_map), which runs only with "
            f"worker.{role}.model.trust_remote_code=true (off by default: the code runs in the driver and every "
            "worker). Read the code, then set that key to true."
        ) from error
