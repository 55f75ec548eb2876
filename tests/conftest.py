"""Shared fixtures. Each fixture module has one owner; import new ones through ``pytest_plugins``."""

pytest_plugins = [
    "tests.fixtures.cluster",
    "tests.fixtures.models",
    "tests.fixtures.vl",
    "tests.fixtures.trainer_runs",
    "tests.fixtures.configs",
]
