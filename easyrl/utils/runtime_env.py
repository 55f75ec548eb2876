"""Process-wide environment fixes that must happen before Ray, vLLM or torchvision are imported.

Called once from ``easyrl/__init__.py`` so that the driver, every Ray worker and every test process agree.
Each fix only sets defaults (``os.environ.setdefault``): a value the user exported always wins.
"""

import importlib.util
import json
import os
import sys
from pathlib import Path


# Ray: a single-machine run must not bind to the default-route address, and local clusters need no token.
_DEFAULT_ENV = {
    "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
    "RAY_AUTH_MODE": "disabled",
    "RAY_DEDUP_LOGS": "0",
    "TOKENIZERS_PARALLELISM": "false",
    # vLLM runs inside our own SPMD workers (external_launcher); never let it fork its own engine process.
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
}


def _install_torchvision_shim() -> None:
    """Make sure torchvision's op-schema shim is active in this process (see easyrl_torchvision_shim.py).

    An installed easyrl already activates it at interpreter start through its .pth file; this covers interpreters
    started with ``-S`` and source trees put on PYTHONPATH without an install (the module sits next to the package).
    """
    try:
        import easyrl_torchvision_shim as shim
    except ModuleNotFoundError:
        path = Path(__file__).resolve().parents[2] / "easyrl_torchvision_shim.py"
        spec = importlib.util.spec_from_file_location("easyrl_torchvision_shim", path)
        if spec is None or not path.is_file():
            raise ImportError(
                "easyrl's installation is incomplete: the module `easyrl_torchvision_shim` is missing. "
                "Reinstall easyrl (`pip install -e .` in the source tree, or scripts/install.sh)."
            ) from None
        shim = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = shim
        spec.loader.exec_module(shim)
    shim.install()


def prepare_process_environment() -> None:
    for key, value in _DEFAULT_ENV.items():
        os.environ.setdefault(key, value)
    _install_torchvision_shim()


# What Ray sets in the driver of a job (`ray job submit`): the job's config, its runtime env included (the name of
# ray._private.runtime_env.constants.RAY_JOB_CONFIG_JSON_ENV_VAR, written out so that config checks need no Ray)
RAY_JOB_CONFIG_ENV = "RAY_JOB_CONFIG_JSON_ENV_VAR"


def ray_job_runtime_env() -> dict | None:
    """The runtime env of the Ray job this process is the driver of ({} when it has none); None when it is no job."""
    text = os.environ.get(RAY_JOB_CONFIG_ENV)
    if not text:
        return None
    return dict(json.loads(text).get("runtime_env") or {})
