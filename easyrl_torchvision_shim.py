"""Let torchvision's pure-Python parts import when its compiled ops cannot load (every interpreter of the venv).

PyPI ships no CPU torchvision for every torch release, so a CPU torch can sit next to a CUDA-linked torchvision
whose ``_C`` library fails to load. ``import torchvision`` then dies in ``torchvision/_meta_registrations.py``
(``register_fake("torchvision::nms")``: "operator torchvision::nms does not exist"), and with it every
``from transformers import <any model>`` (transformers' image utilities import torchvision). Declaring the two op
schemas that file registers fake kernels for is enough for the image transforms; calling ``nms`` itself would still
raise.

easyrl's install puts a ``.pth`` file next to this module that calls :func:`install` at interpreter start, so a plain
``python`` of the venv works without importing easyrl. The hook costs nothing until torchvision is imported: it
imports neither torch nor torchvision itself, and does nothing when torchvision's compiled ops load (GPU builds).
Standard library only: it runs before anything else of the environment.
"""

import sys


# the ops torchvision/_meta_registrations.py registers fake kernels for unconditionally
_OP_SCHEMAS = {
    "nms": "(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "qnms": "(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
}
_WATCHED_MODULE = "torchvision.extension"  # loads torchvision's _C library; runs before _meta_registrations


def define_missing_op_schemas() -> list[str]:
    """Declare the torchvision op schemas that are missing; returns the names declared."""
    import torch  # already imported by torchvision.extension when called from the hook

    declared = []
    for name, schema in _OP_SCHEMAS.items():
        if not torch._C._jit_get_schemas_for_operator(f"torchvision::{name}"):
            torch.library.define(f"torchvision::{name}", schema)
            declared.append(name)
    return declared


class TorchvisionOpsFinder:
    """Meta-path finder that lets ``torchvision.extension`` load normally, then declares the schemas if its compiled
    ops did not load."""

    @classmethod
    def find_spec(cls, fullname, path=None, target=None):
        if fullname != _WATCHED_MODULE:
            return None
        from importlib.machinery import PathFinder

        spec = PathFinder.find_spec(fullname, path, target)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        load = spec.loader.exec_module

        def exec_module(module):
            load(module)
            if not module._has_ops():
                define_missing_op_schemas()

        spec.loader.exec_module = exec_module  # this loader instance serves this one import only
        return spec


def install() -> None:
    """Put the finder first on ``sys.meta_path`` (once). When ``torchvision.extension`` already ran (e.g. a failed
    ``import torchvision`` leaves it in ``sys.modules``), declare the missing schemas right away instead."""
    extension = sys.modules.get(_WATCHED_MODULE)
    if extension is not None:
        if not extension._has_ops():
            define_missing_op_schemas()
        return
    if not any(getattr(finder, "__name__", None) == TorchvisionOpsFinder.__name__ for finder in sys.meta_path):
        sys.meta_path.insert(0, TorchvisionOpsFinder)
