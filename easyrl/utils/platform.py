"""Facts about this machine that need no torch import (``easyrl check`` answers in well under two seconds).

``easyrl.utils.device`` is the switch the compute code uses; this module only tells the config what the machine has.
"""

import os


def nvidia_gpus_visible() -> bool:
    """True when the NVIDIA driver reports GPUs and CUDA_VISIBLE_DEVICES does not hide them all."""
    if os.environ.get("CUDA_VISIBLE_DEVICES") in ("", "-1"):
        return False
    gpus = "/proc/driver/nvidia/gpus"
    return os.path.isdir(gpus) and bool(os.listdir(gpus))
