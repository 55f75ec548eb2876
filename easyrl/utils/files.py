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
