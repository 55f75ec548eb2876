"""Process-wide environment fixes that must happen before Ray, vLLM or torchvision are imported.

Called once from ``easyrl/__init__.py`` so that the driver, every Ray worker and every test process agree.
Each fix only sets defaults (``os.environ.setdefault``): a value the user exported always wins.
"""

import importlib.metadata
import importlib.util
import os


# Ray: a single-machine run must not bind to the default-route address, and local clusters need no token.
_DEFAULT_ENV = {
    "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
    "RAY_AUTH_MODE": "disabled",
    "RAY_DEDUP_LOGS": "0",
    "TOKENIZERS_PARALLELISM": "false",
    # vLLM runs inside our own SPMD workers (external_launcher); never let it fork its own engine process.
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
}


def _cpu_torch_with_cuda_torchvision() -> bool:
    """True when torch is a CPU build but the installed torchvision wheel was built against CUDA torch.

    PyPI ships no CPU torchvision for every torch release, so pip can pair a CPU torch with a CUDA-linked
    torchvision whose compiled ops fail to load.
    """
    import torch

    if torch.version.cuda is not None or importlib.util.find_spec("torchvision") is None:
        return False
    try:
        version = importlib.metadata.version("torchvision")
    except importlib.metadata.PackageNotFoundError:
        return False
    return not version.endswith("+cpu")


def _define_torchvision_op_schemas() -> None:
    """Declare the schemas of torchvision's compiled ops so that its pure-Python parts import.

    torchvision registers fake kernels for ``torchvision::nms`` at import; without the compiled library the
    schema is missing and ``import torchvision`` fails, which breaks Qwen-VL image processors. With the schema
    declared, image transforms work; calling ``nms`` itself would still raise (we never do).
    """
    import torch

    schemas = {
        "nms": "(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
        "qnms": "(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    }
    for name, schema in schemas.items():
        if not torch._C._jit_get_schemas_for_operator(f"torchvision::{name}"):
            torch.library.define(f"torchvision::{name}", schema)


def prepare_process_environment() -> None:
    for key, value in _DEFAULT_ENV.items():
        os.environ.setdefault(key, value)
    if importlib.util.find_spec("torch") is not None and _cpu_torch_with_cuda_torchvision():
        _define_torchvision_op_schemas()
