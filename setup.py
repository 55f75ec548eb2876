"""Build hooks that pyproject.toml cannot express; all metadata lives in pyproject.toml.

Every install (wheel or ``pip install -e .``) puts ``easyrl-torchvision-shim.pth`` into site-packages. Python runs
it at interpreter start, so every program of the environment (not only those that import easyrl) can import
transformers next to a torchvision whose compiled ops do not load: see easyrl_torchvision_shim.py.
"""

from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py


SHIM_MODULE = "easyrl_torchvision_shim"
PTH_NAME = "easyrl-torchvision-shim.pth"
# `.pth` lines that start with "import" are executed by site.py; this one only appends a finder to sys.meta_path
PTH_LINE = f"import {SHIM_MODULE}; {SHIM_MODULE}.install()\n"


class BuildPyWithPth(build_py):
    """Regular wheels: the .pth sits at the wheel's root, which installs into site-packages."""

    def run(self):
        super().run()
        if not self.editable_mode:
            target = Path(self.build_lib, PTH_NAME)
            target.write_text(PTH_LINE, encoding="utf-8")
            self._pth_outputs = [str(target)]

    def get_outputs(self, include_bytecode=True):
        return super().get_outputs(include_bytecode) + getattr(self, "_pth_outputs", [])


cmdclass = {"build_py": BuildPyWithPth}

try:  # setuptools >= 64 builds editable installs as a wheel of their own (PEP 660)
    from setuptools.command.editable_wheel import editable_wheel
except ImportError:  # pragma: no cover - older setuptools: pyproject.toml requires >= 69
    editable_wheel = None

# _select_strategy is setuptools' hook for the editable layout (setuptools 64 to 84 at least); without it the editable
# install lacks the .pth, which tests/test_torchvision_shim.py and scripts/install.sh report
if editable_wheel is not None and hasattr(editable_wheel, "_select_strategy"):

    class _StrategyWithPth:
        """Wraps setuptools' editable strategy (which writes its own __editable__ .pth into the wheel) to write ours
        too, inside the open wheel so that RECORD lists it and `pip uninstall` removes it."""

        def __init__(self, strategy):
            self.strategy = strategy

        def __enter__(self):
            self.strategy.__enter__()
            return self

        def __exit__(self, *exc_info):
            return self.strategy.__exit__(*exc_info)

        def __call__(self, wheel, files, mapping):
            self.strategy(wheel, files, mapping)
            wheel.writestr(PTH_NAME, PTH_LINE.encode("utf-8"))

    class EditableWheelWithPth(editable_wheel):
        """Editable installs: the same .pth; the module itself is found through the editable finder, so edits to
        it take effect without reinstalling."""

        def _select_strategy(self, name, tag, build_lib):
            return _StrategyWithPth(super()._select_strategy(name, tag, build_lib))

    cmdclass["editable_wheel"] = EditableWheelWithPth


setup(py_modules=[SHIM_MODULE], cmdclass=cmdclass)
