"""Files that are either the old version or the new one, never half of each (no torch: the loggers use it too)."""

import os


def replace_file(path: str, data: str | bytes) -> None:
    """Write ``data`` to ``path`` atomically: a temporary file next to it, fsync, then a rename over ``path``."""
    staging = f"{path}.tmp.{os.getpid()}"
    with open(staging, "wb") as handle:
        handle.write(data.encode("utf-8") if isinstance(data, str) else data)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(staging, path)


def open_like_new_files(folder: str, suffix: str = ".safetensors") -> None:
    """Give the ``suffix`` files of ``folder`` the permissions a new file of this process gets (its umask): the
    safetensors library (0.8) writes weights as 0600, so that on a shared filesystem nobody else could read a
    merged or trained model while its config and tokenizer beside it were readable."""
    probe = os.path.join(folder, f".easyrl-mode-probe.{os.getpid()}")
    with open(probe, "w"):
        pass
    try:
        mode = os.stat(probe).st_mode & 0o777
    finally:
        os.remove(probe)
    for name in os.listdir(folder):
        path = os.path.join(folder, name)
        if name.endswith(suffix) and os.path.isfile(path) and os.stat(path).st_mode & 0o777 != mode:
            os.chmod(path, mode)
