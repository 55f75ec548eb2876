"""An actor on one rank without Ray: the worker's compute path (FSDP2 model, optimizer, Actor) in a plain process.

The GPU test suite (tests/gpu) and benchmarks/actor_update_gpu.py run the update this way on a machine that has
PyTorch and transformers but neither Ray nor vLLM. The caller owns the process group (one rank, nccl or gloo).
"""

import os
import socket
from contextlib import contextmanager

import torch


@contextmanager
def one_rank_process_group():
    """A world of one (nccl on a GPU, gloo otherwise) on a free local port; destroyed on exit."""
    import torch.distributed as dist

    from ..utils import device

    if dist.is_initialized():
        yield
        return
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    device.set_device(0)
    dist.init_process_group(device.get_dist_backend(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def build_actor(model_path: str, overrides: list[str], *, batch_size: int, trainable: bool = True):
    """(actor, module, optimizer) built as a worker builds them, from ``worker.actor.*`` overrides.

    Goes through ``load_config`` so aliases resolve as in a real run; ``batch_size`` samples make one optimizer step.
    """
    from ..config import load_config
    from ..workers.actor import Actor
    from ..workers.fsdp_utils import build_device_mesh, build_fsdp_model
    from ..workers.optim import build_optimizer

    config = load_config([f"worker.actor.model.model_path={model_path}", *overrides], validate=False).worker.actor
    module = build_fsdp_model(
        config.model,
        config.fsdp,
        build_device_mesh(1, -1),
        kind="causal_lm",
        trainable=trainable,
        default_dtype=torch.float32,
    )
    optimizer = build_optimizer(module, config.optim, "worker.actor.optim") if trainable else None
    actor = Actor(config, module, optimizer, mini_batch_size=batch_size if trainable else None)
    return actor, module, optimizer
