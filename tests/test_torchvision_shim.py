"""Every interpreter of the environment can import transformers' models and image processors, not only those that
import easyrl: the installed .pth activates easyrl_torchvision_shim at start-up (a CPU torch next to a CUDA-linked
torchvision otherwise fails with "operator torchvision::nms does not exist")."""

import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest


pytestmark = pytest.mark.timeout(300)

REINSTALL = "the installed easyrl predates the .pth hook: reinstall it (`pip install -e .` or scripts/install.sh)"

# No `import easyrl` anywhere: a tiny Llama built from its config and a Qwen2-VL image processor run on a picture.
PLAIN_PROGRAM = """
import sys
import numpy as np
from PIL import Image
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2VLImageProcessor

config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                     num_attention_heads=1, num_key_value_heads=1)
model = LlamaForCausalLM(config)
processor = Qwen2VLImageProcessor(min_pixels=28 * 28, max_pixels=56 * 56)
out = processor(images=[Image.fromarray(np.zeros((56, 56, 3), dtype=np.uint8))], return_tensors="pt")
print(sum(p.numel() for p in model.parameters()), tuple(out["pixel_values"].shape), out["image_grid_thw"].tolist(),
      "easyrl" in sys.modules)
"""


def run_plain_python(code: str, tmp_path: Path) -> subprocess.CompletedProcess:
    # cwd outside the source tree: the shim must come from the installed environment, not from the current folder
    return subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=240)


def test_the_install_puts_the_pth_hook_into_site_packages():
    pth = Path(sysconfig.get_paths()["purelib"], "easyrl-torchvision-shim.pth")
    assert pth.is_file(), REINSTALL
    assert pth.read_text().strip() == "import easyrl_torchvision_shim; easyrl_torchvision_shim.install()"


def test_a_plain_interpreter_builds_a_model_and_an_image_processor_without_importing_easyrl(tmp_path):
    result = run_plain_python(PLAIN_PROGRAM, tmp_path)
    assert result.returncode == 0, f"{REINSTALL}\n{result.stderr[-3000:]}"
    # Llama: embed 64x32 + lm_head 64x32 + q,o 32x32 + k,v 32x32 + mlp 3 x 32x64 + 3 norms x 32 = 14432 parameters;
    # a 56x56 picture is 4x4 patches of 14 px, each 3 channels x 2 frames x 14 x 14 = 1176 values
    assert result.stdout.split() == ["14432", "(16,", "1176)", "[[1,", "4,", "4]]", "False"]


def test_interpreter_start_imports_neither_torch_nor_torchvision(tmp_path):
    code = (
        "import sys; print('torch' in sys.modules, 'torchvision' in sys.modules,"
        " [getattr(f, '__name__', '') for f in sys.meta_path].count('TorchvisionOpsFinder'))"
    )
    result = run_plain_python(code, tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["False", "False", "1"], REINSTALL


def test_without_the_hook_this_environment_would_fail(tmp_path):
    """The hook is what makes the plain program work here: removed, torchvision fails to import again (only on a
    machine whose torchvision has no working compiled ops; elsewhere there is nothing to fix)."""
    probe = run_plain_python("import torchvision.extension as e; print(e._has_ops())", tmp_path)
    assert probe.returncode == 0, probe.stderr
    if probe.stdout.strip() == "True":
        pytest.skip("torchvision's compiled ops load on this machine: the hook has nothing to fix")
    remove_hook = (
        "import sys; sys.meta_path[:] = [f for f in sys.meta_path"
        " if getattr(f, '__name__', '') != 'TorchvisionOpsFinder']\n"
    )
    result = run_plain_python(remove_hook + "import torchvision", tmp_path)
    assert result.returncode != 0
    assert "operator torchvision::nms does not exist" in result.stderr


def test_importing_easyrl_leaves_one_hook(tmp_path):
    result = run_plain_python(
        "import sys, easyrl; print([getattr(f, '__name__', '') for f in sys.meta_path].count('TorchvisionOpsFinder'))",
        tmp_path,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "1"
