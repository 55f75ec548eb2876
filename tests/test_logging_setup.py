"""The console shows the run; engine and library chatter goes to <run_dir>/logs/. Each case runs in a fresh
interpreter, since logging configuration is process-wide."""

import json
import logging
import subprocess
import sys

import pytest

from easyrl.workers.rollout.weight_sync import ExpectedReloadWarnings


pytestmark = pytest.mark.timeout(300)

WORKER_PROGRAM = """
import logging, sys, warnings
from easyrl.utils.logging import setup_worker_logging
path = setup_worker_logging(sys.argv[1], rank=3)
logging.getLogger("vllm.v1.engine.core").info("ENGINE-INFO init engine took 0.04 s")
logging.getLogger("vllm.model_executor.model_loader").warning("ENGINE-WARNING CPU backend skips set_num_threads")
logging.getLogger("ray.util").info("RAY-INFO actor started")
logging.getLogger("ray.util").warning("RAY-WARNING a repeated warning of every worker")
from transformers.utils import logging as hf_logging
hf_logging.get_logger("transformers.modeling_utils").warning("HF-WARNING generation flags are not valid")
warnings.warn("PY-WARNING a deprecation from a library")
logging.getLogger("easyrl.workers.actor").info("EASYRL-INFO detail for the file")
logging.getLogger("easyrl.workers.actor").warning("EASYRL-WARNING something the user must know")
print("PRINTED by a library")
import os
os.write(2, b"RAW-STDERR [W utils.cpp:68] a C++ warning" + bytes([10]))
from tqdm import tqdm
for _ in tqdm(range(3), desc="TQDM-BAR loading shards"):
    pass
print(path)  # stdout is the log file now
"""

DRIVER_PROGRAM = """
import logging, sys, warnings
from easyrl.utils.logging import setup_driver_logging
path = setup_driver_logging(sys.argv[1])
import ray
logging.getLogger("easyrl.trainer.main").info("EASYRL-INFO training steps: 2")
logging.getLogger("ray.worker").info("RAY-INFO started a local Ray instance")
warnings.warn("PY-WARNING set_vital is deprecated")
logging.getLogger("urllib3.connectionpool").debug("URLLIB-DEBUG never shown")
logging.getLogger("datasets.builder").warning("DATASETS-WARNING a library warning on the driver")
print(path)
"""


def run(program: str, run_dir) -> tuple[str, str]:
    result = subprocess.run([sys.executable, "-c", program, str(run_dir)], capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout, result.stderr


def test_worker_console_keeps_only_easyrl_warnings_and_the_file_keeps_everything(tmp_path):
    stdout, stderr = run(WORKER_PROGRAM, tmp_path)
    log_file = tmp_path / "logs" / "worker_3.log"
    # the console (what Ray forwards to the driver) is one line
    assert stdout == ""
    assert stderr == "WARNING easyrl.workers.actor: EASYRL-WARNING something the user must know\n"
    text = log_file.read_text()
    for line in (
        str(log_file),
        "PRINTED by a library",
        "RAW-STDERR [W utils.cpp:68] a C++ warning",
        "TQDM-BAR loading shards",
        "INFO",
        "vllm.v1.engine.core: ENGINE-INFO init engine took 0.04 s",
        "ENGINE-WARNING",
        "RAY-INFO",
        "RAY-WARNING",
        "HF-WARNING",
        "PY-WARNING",
        "EASYRL-INFO",
        "EASYRL-WARNING",
    ):
        assert line in text, f"{line} missing from {log_file}:\n{text}"


def test_driver_console_shows_easyrl_info_and_library_warnings_but_not_library_info(tmp_path):
    stdout, stderr = run(DRIVER_PROGRAM, tmp_path)
    log_file = tmp_path / "logs" / "driver.log"
    assert stdout.strip() == str(log_file)
    assert stderr.splitlines() == [
        f"Engine and library logs: {log_file.parent}",
        "EASYRL-INFO training steps: 2",
        "WARNING datasets.builder: DATASETS-WARNING a library warning on the driver",
    ]
    text = log_file.read_text()
    for line in ("RAY-INFO started a local Ray instance", "EASYRL-INFO", "DATASETS-WARNING", "PY-WARNING"):
        assert line in text, f"{line} missing from {log_file}:\n{text}"
    assert "URLLIB-DEBUG" not in text


def _reload_record(layer: str) -> logging.LogRecord:
    return logging.LogRecord(
        "vllm.model_executor.model_loader.reload.layerwise", logging.WARNING, "layerwise.py", 266,
        "%s: Failed to load weights", (layer,), None,
    )  # fmt: skip


def test_only_the_expected_unfilled_layers_are_silenced():
    tied, untied = ExpectedReloadWarnings(tied_embeddings=True), ExpectedReloadWarnings(tied_embeddings=False)
    # the rotary cache is computed from the config; a tied head shares the embedding the stream fills
    assert not tied.filter(_reload_record("RotaryEmbedding"))
    assert not tied.filter(_reload_record("MRotaryEmbedding"))
    assert not tied.filter(_reload_record("ParallelLMHead"))
    # an untied head that got nothing, or any other layer, is a weight the actor did not send: it still warns
    assert untied.filter(_reload_record("ParallelLMHead"))
    assert tied.filter(_reload_record("QKVParallelLinear"))
    other = _reload_record("RotaryEmbedding")
    other.msg = "%s: Excessive loading"
    assert tied.filter(other)


ENGINE_PROBE = "tests.engine_logging_probe"


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_engine_worker_console_is_quiet_sync_is_exact_and_compile_survives_the_engine(tmp_path):
    """A worker-like process: logging set up, a vLLM engine started and synced with perturbed weights, then the
    compiled log-prob kernels called."""
    result = subprocess.run(
        [sys.executable, "-m", ENGINE_PROBE, str(tmp_path)], capture_output=True, text=True, timeout=850
    )
    assert result.returncode == 0, result.stderr[-5000:]
    console = result.stdout + result.stderr
    report = json.loads((tmp_path / "probe_report.json").read_text())
    # weights after the sync equal the actor's: greedy tokens and the shared (tied) embedding / lm_head
    assert report["vllm_greedy"] == report["hf_greedy"]
    assert report["embedding_max_diff"] == 0.0 and report["lm_head_is_embedding"]
    assert report["rotary_cache_unchanged"]
    # torch.compile still works in the process after vLLM's import-time TORCHDYNAMO_DISABLE
    assert report["compiled_calls"] >= 1 and report["compile_unavailable"] is None
    # console: no vLLM INFO line, no reload warning; the file has vLLM's lines
    assert " INFO " not in console and "Failed to load weights" not in console, console[-5000:]
    log_text = (tmp_path / "logs" / "worker_0.log").read_text()
    assert "vllm" in log_text and "Reloading weights inplace" in log_text
    assert "Failed to load weights" not in log_text
