"""The one device switch: every CUDA/NCCL-specific call in easyrl goes through this module.

On a machine without an NVIDIA GPU the same code runs on CPU with the gloo backend.
"""

import torch


def is_cuda_available() -> bool:
    return torch.cuda.is_available()


def get_device_name() -> str:
    """``"cuda"`` on NVIDIA GPUs, ``"cpu"`` otherwise."""
    return "cuda" if is_cuda_available() else "cpu"


def get_torch_device() -> torch.device:
    """The device this process computes on (the current CUDA device, or the CPU)."""
    if is_cuda_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def get_dist_backend() -> str:
    """The torch.distributed backend for this device: nccl on GPU, gloo on CPU."""
    return "nccl" if is_cuda_available() else "gloo"


def get_ray_resource_name() -> str:
    """The Ray resource one worker reserves: a GPU where there is one, a CPU slot otherwise."""
    return "GPU" if is_cuda_available() else "CPU"


def set_device(local_rank: int) -> None:
    if is_cuda_available():
        torch.cuda.set_device(local_rank)


def synchronize() -> None:
    if is_cuda_available():
        torch.cuda.synchronize()


def empty_cache() -> None:
    if is_cuda_available():
        torch.cuda.empty_cache()


def memory_allocated_gb() -> float:
    if is_cuda_available():
        return torch.cuda.memory_allocated() / 2**30
    return 0.0


def supports_sleep_mode() -> bool:
    """vLLM sleep mode frees GPU memory between rollouts; vLLM rejects it on CPU."""
    return is_cuda_available()


def prepare_cpu_kernels() -> None:
    """Ask the kernel for AMX tile permission before vLLM's CPU attention runs.

    vLLM's bf16 CPU kernels use AMX without requesting it; a tiny first forward then dies with SIGILL.
    """
    if not is_cuda_available():
        init_amx = getattr(getattr(torch._C, "_cpu", None), "_init_amx", None)
        if init_amx is not None:
            init_amx()
