"""Shared fixtures. Each fixture module has one owner; import new ones through ``pytest_plugins``."""

import os


# A Ray call made before ray.init fails instead of starting a Ray of this machine's CPUs behind the test's back
# (read when Ray is first imported; runs started in subprocesses call ray.init themselves).
os.environ["RAY_ENABLE_AUTO_CONNECT"] = "0"

pytest_plugins = [
    "tests.fixtures.cluster",
    "tests.fixtures.models",
    "tests.fixtures.vl",
    "tests.fixtures.trainer_runs",
    "tests.fixtures.configs",
]
