"""Running an untrusted Python program (a model-written solution) with limits and isolation, for code rewards.

    from easyrl.workers.reward.sandbox import Limits, run_program
    result = run_program("print(int(input()) * 2)", stdin="21\\n", limits=Limits(cpu_seconds=2))
    result.stdout, result.exit_code, result.limit    # "42\\n", 0, None

Each call is one sandbox: a fresh working directory (deleted afterwards), a cleared environment (PATH, HOME and
locale only: no token or key of the trainer reaches the program), a new session whose process group is SIGKILLed at
the end (also on time-out), and a small launcher (sandbox_launcher.py) that applies the limits and the isolation in
the child before it execs `python -I -S -B main.py` (isolated mode, standard library only). Calls are thread-safe
and independent: run many at once from a thread pool.

A caller killed mid-run (SIGKILL: Ray replacing a reward actor past `worker.reward.timeout_s`) takes its sandboxes
with it: the launcher asks the kernel for a signal when its caller exits and then kills its process group (the
program, and the pid namespace where there is one). The folder of such a run, named `easyrl-sandbox-<caller pid>-*`
and locked while in use, is deleted by the first run of the next process that runs a sandbox (the replacement
actor), or by `remove_orphaned_folders()`; a folder whose owner lives is never touched.

Always, on every POSIX host (resource limits set in the child, enforced by the kernel):
    CPU time       RLIMIT_CPU: SIGXCPU at `cpu_seconds`, SIGKILL one second later            -> limit "cpu_time"
    wall time      the launcher SIGKILLs the program at `wall_seconds`; the caller kills the whole process group
                   if the launcher itself is late                                            -> limit "wall_time"
    memory         RLIMIT_AS (`memory_mb` of address space per process; Python raises MemoryError) -> "memory"
    output         stdout and stderr are read with a cap of `max_output_bytes` each; past it the program is killed,
                   so 1 GB of output never reaches the caller's memory                        -> limit "output"
    files written  RLIMIT_FSIZE (`max_file_bytes` per file, SIGXFSZ past it), RLIMIT_NOFILE -> limit "file_size"
    core dumps     RLIMIT_CORE 0

Isolation, each layer used where the host has it (`host_protections()` probes once per process and the first run
logs, once, every layer that is missing and what that means; `run_program(..., require=...)` raises instead):
    namespaces     unprivileged user + network + pid + mount + ipc + uts namespaces (`unshare`): the program has no
                   network at all (an empty network namespace: not even loopback reaches the host's 127.0.0.1), sees
                   only its own processes in a private /proc (no other process's environment or command line), cannot
                   signal processes outside, and everything it starts dies with the sandbox's pid 1.
                   Needs: Linux user namespaces allowed for the user (most distributions; Ubuntu >= 24.04 restricts
                   them through AppArmor: `sysctl kernel.apparmor_restrict_unprivileged_userns=0`; Debian < 11 needs
                   `sysctl kernel.unprivileged_userns_clone=1`; many container runtimes block `unshare` by seccomp).
    landlock       Landlock LSM (Linux >= 5.13 with `landlock` in the boot `lsm=` list) through the `landlock` package:
                   the program reads only the Python installation, the system libraries and its own folder, and writes
                   only to its own folder and /dev/null. Files elsewhere (datasets, checkpoints, keys, /proc, /tmp)
                   are out of reach, even for a trainer running as root.
    seccomp        a seccomp filter (libseccomp through the `pyseccomp` package): no process creation (fork, vfork,
                   non-thread clone: a fork bomb cannot start), no sockets of any family (no network, no host UNIX
                   sockets such as a container runtime's), no signals to other processes, and no ptrace, mount, namespace, keyring, BPF, perf,
                   io_uring, userfaultfd, module or clock calls (EPERM): less of the kernel to attack.
Install the two packages with `pip install "easyrl[sandbox]"`.

What a missing layer leaves open (the limits above and the killing still hold):
    no namespaces  network: still closed when seccomp works (no sockets), else OPEN; the program can list host
                   processes in /proc and, when no Landlock hides /proc, read the environment of processes of the
                   same user; it can signal processes of the same user; children that call setsid() escape the final
                   group kill unless seccomp stops them being created.
    no landlock    the program reads and writes whatever the trainer's user may (run the trainer as an unprivileged
                   user, or use a container whose file system holds nothing secret).
    no seccomp     process creation is bounded only by RLIMIT_NPROC (`max_processes`), which Linux does not enforce
                   for root and counts per user (every process and thread of that user, sandboxed or not); without
                   namespaces, sockets work (the network is open).
    neither        namespaces nor seccomp: the program can signal every process of the trainer's user (for root:
                   every process on the host, the trainer included). Do not train as root on such a host, or
                   `require` a layer.

What it does not protect against, even with every layer: it is not a virtual machine. A kernel vulnerability
reachable through the allowed system calls (file, memory, thread calls) can break out; CPU caches, timing and other
side channels are shared with the host; the program shares the host's CPU and memory bandwidth and its disk (up to
`max_file_bytes` per file, any number of files while it runs, removed after); /dev/urandom and the system libraries
are readable. For hostile code at scale use a VM or gVisor-class sandbox around the whole reward worker.
"""

import contextlib
import fcntl
import functools
import json
import logging
import os
import re
import selectors
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path


logger = logging.getLogger(__name__)

LAUNCHER = Path(__file__).with_name("sandbox_launcher.py")
LAYERS = ("namespaces", "landlock", "seccomp")
SETUP_FAILED = 125  # sandbox_launcher.SETUP_FAILED
_EXTRA_HINT = 'pip install "easyrl[sandbox]"'
_KILL_GRACE_S = 2.0  # the caller's own deadline runs this long after the launcher's, which normally fires first
_FOLDER_PREFIX = "easyrl-sandbox-"
_OWNED_FOLDER = re.compile(re.escape(_FOLDER_PREFIX) + r"(\d+)-\w+")  # easyrl-sandbox-<owner pid>-<random>


@dataclass(frozen=True)
class Limits:
    """Resource limits of one run."""

    cpu_seconds: float = 5.0  # CPU time of the program (RLIMIT_CPU, whole seconds, rounded up)
    wall_seconds: float = 10.0  # real time, start of the interpreter included
    memory_mb: int = 1024  # address space per process (RLIMIT_AS)
    max_output_bytes: int = 8 << 20  # stdout and stderr, each; past it the program is killed
    max_file_bytes: int = 16 << 20  # largest file the program may write (RLIMIT_FSIZE)
    max_open_files: int = 256  # RLIMIT_NOFILE
    max_processes: int = 64  # RLIMIT_NPROC, used only where seccomp cannot refuse process creation


@dataclass
class RunResult:
    """What one run produced. `limit` names the limit that stopped it ("cpu_time", "wall_time", "memory",
    "output", "file_size") or "sandbox_error" when the sandbox could not be set up (the program did not run)."""

    stdout: str
    stderr: str
    exit_code: int | None  # None when a signal ended the program
    signal: int | None
    limit: str | None
    wall_seconds: float
    cpu_seconds: float
    error: str = ""  # the sandbox's own failure, for "sandbox_error"

    @property
    def ok(self) -> bool:
        """The program exited with status 0 within every limit."""
        return self.exit_code == 0 and self.limit is None


@dataclass(frozen=True)
class HostProtections:
    """Which isolation layers work on this host (see the module docstring for what each one gives)."""

    namespaces: bool
    private_proc: bool
    landlock: bool
    landlock_abi: int
    seccomp: bool
    root: bool
    reasons: dict[str, str] = field(default_factory=dict)  # layer -> why it is unavailable

    @property
    def missing(self) -> list[str]:
        return [layer for layer in LAYERS if not getattr(self, layer)]

    def describe_missing(self) -> str:
        consequences = {
            "namespaces": "no network/pid/mount namespaces: "
            + ("network closed by seccomp only" if self.seccomp else "the NETWORK IS OPEN to the program")
            + "; host processes visible",
            "landlock": "no Landlock: the program can read and write every file the trainer's user can",
            "seccomp": "no seccomp filter: process creation is limited only by RLIMIT_NPROC"
            + (", which Linux does not enforce for root" if self.root else "")
            + ("" if self.namespaces else "; the program can signal (kill) every process of the trainer's user"),
        }
        described = [f"{consequences[layer]} ({self.reasons.get(layer, 'unavailable')})" for layer in self.missing]
        if self.namespaces and not self.private_proc:
            described.append(
                "no private /proc: host processes visible"
                + ("" if self.landlock else ", and the environment of the trainer's user's processes readable")
                + f" ({self.reasons.get('private_proc', 'unavailable')})"
            )
        return "; ".join(described)


class SandboxUnavailableError(RuntimeError):
    """A protection the caller required (`require=`) does not work on this host."""


# ----------------------------------------------------------------------------------------------------------------------
# host probe
# ----------------------------------------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=1)
def _library_paths() -> list[str]:
    """The site-packages folders holding `landlock` and `pyseccomp`, for the launcher (which runs without site)."""
    paths = []
    for name in ("landlock", "pyseccomp"):
        try:
            module = __import__(name)
        except (ImportError, OSError):  # pyseccomp raises OSError-like errors without libseccomp
            continue
        except Exception:  # noqa: BLE001 - a broken optional package is reported by the probe as missing
            continue
        folder = Path(module.__file__).resolve().parent
        paths.append(str(folder.parent if folder.name == name else folder))
    return list(dict.fromkeys(paths))


def _python() -> str:
    """The interpreter that runs launcher and program: the real file, not the virtual environment's link."""
    return os.path.realpath(sys.executable)


def _clean_env(home: str) -> dict[str, str]:
    return {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": home,
        "TMPDIR": home,
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "PYTHONIOENCODING": "utf-8",
        "PYTHONHASHSEED": "0",
        "PYTHONDONTWRITEBYTECODE": "1",
    }


@functools.lru_cache(maxsize=1)
def host_protections() -> HostProtections:
    """Probe (once per process, ~0.1 s) which isolation layers this host supports."""
    with _owned_folder() as folder:
        completed = subprocess.run(
            [_python(), "-I", "-S", "-B", str(LAUNCHER), "--probe", json.dumps(_library_paths())],
            cwd=folder,
            env=_clean_env(folder),
            capture_output=True,
            timeout=60,
            start_new_session=True,
        )
    try:
        found = json.loads(completed.stdout.decode().strip().splitlines()[-1])
    except (IndexError, ValueError):
        reason = f"the probe failed (exit {completed.returncode}): {completed.stderr.decode(errors='replace')[-500:]}"
        return HostProtections(False, False, False, 0, False, os.geteuid() == 0, dict.fromkeys(LAYERS, reason))
    reasons = {layer: found[layer] for layer in (*LAYERS, "private_proc") if found.get(layer)}
    return HostProtections(
        namespaces=found["namespaces"] is None,
        private_proc=found["private_proc"] is None,
        landlock=found["landlock"] is None,
        landlock_abi=int(found.get("landlock_abi", 0)),
        seccomp=found["seccomp"] is None,
        root=bool(found.get("root")),
        reasons=reasons,
    )


_warned = threading.Lock()
_warned_once: list[bool] = []


def check_protections(require: Iterable[str] = ()) -> HostProtections:
    """The host's layers; raise SandboxUnavailableError when one in `require` is missing, else log (once per
    process) the missing ones and what that leaves open."""
    protections = host_protections()
    if isinstance(require, str):  # one layer, as a command line gives it (`require=seccomp`), not its letters
        require = [require]
    required = set(LAYERS if "all" in require else require)
    unknown = required - set(LAYERS)
    if unknown:
        raise ValueError(f"Unknown sandbox layer(s) {sorted(unknown)} in `require`; choose from {LAYERS} or 'all'.")
    lacking = [layer for layer in LAYERS if layer in required and not getattr(protections, layer)]
    if lacking:
        raise SandboxUnavailableError(
            f"The code sandbox needs {', '.join(lacking)}, which this host does not provide: "
            + "; ".join(f"{layer}: {protections.reasons.get(layer, 'unavailable')}" for layer in lacking)
            + f". Install the Python packages with `{_EXTRA_HINT}`; Landlock needs Linux >= 5.13 with landlock in "
            "the `lsm=` boot list; namespaces need unprivileged user namespaces (sysctl "
            "kernel.apparmor_restrict_unprivileged_userns=0 on Ubuntu >= 24.04) and a container that allows unshare."
        )
    with _warned:
        if (protections.missing or not protections.private_proc) and not _warned_once:
            _warned_once.append(True)
            logger.warning(
                "Code sandbox runs with reduced isolation on this host: %s.", protections.describe_missing()
            )
    return protections


# ----------------------------------------------------------------------------------------------------------------------
# one run
# ----------------------------------------------------------------------------------------------------------------------
def _readable_paths(python: str) -> list[str]:
    """What the program may read (besides its folder): the interpreter, its standard library, system libraries."""
    paths = {python, sys.base_prefix, sys.base_exec_prefix}
    for key in ("stdlib", "platstdlib"):
        paths.add(sysconfig.get_path(key))
    paths.update(["/lib", "/lib64", "/usr/lib", "/usr/lib64", "/usr/local/lib", "/etc/ld.so.cache"])
    paths.update(["/etc/localtime", "/usr/share/zoneinfo", "/dev/urandom", "/dev/random", "/dev/zero"])
    return sorted({os.path.realpath(p) for p in paths if p and os.path.exists(p)})


def _remove_tree(folder: str) -> None:
    """Delete the run's folder, whatever permissions the program left on what it made."""

    def make_writable_and_retry(function, path, _exc_info):
        try:
            os.chmod(os.path.dirname(path), 0o700)
            if os.path.isdir(path) and not os.path.islink(path):
                os.chmod(path, 0o700)
            function(path)
        except OSError:
            pass

    shutil.rmtree(folder, onerror=make_writable_and_retry)
    if os.path.exists(folder):
        logger.warning("Could not remove the sandbox folder %s.", folder)


@contextlib.contextmanager
def _owned_folder() -> Iterator[str]:
    """A throwaway folder named for this process (easyrl-sandbox-<pid>-...) and locked (flock) while in use, deleted
    at the end; a caller SIGKILLed before the end leaves it to `remove_orphaned_folders`."""
    folder = tempfile.mkdtemp(prefix=f"{_FOLDER_PREFIX}{os.getpid()}-")
    lock = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield folder
    finally:
        _remove_tree(folder)
        os.close(lock)


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's
        return True
    return True


def remove_orphaned_folders(base: str | None = None) -> list[str]:
    """Delete the sandbox folders in `base` (the temp folder) whose owner died mid-run, e.g. a reward actor SIGKILLed
    at `worker.reward.timeout_s`: this user's folders whose owner pid is gone and whose lock nobody holds (a live
    owner in another pid namespace sharing /tmp keeps its lock). Returns the folders removed."""
    base = base or tempfile.gettempdir()
    removed = []
    try:
        entries = list(os.scandir(base))
    except OSError:
        return removed
    for entry in entries:
        owner = _OWNED_FOLDER.fullmatch(entry.name)
        try:
            if not owner or not entry.is_dir(follow_symlinks=False) or entry.stat().st_uid != os.getuid():
                continue
            if _process_alive(int(owner[1])):
                continue
            lock = os.open(entry.path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        except OSError:  # removed meanwhile (by another sweep)
            continue
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            if os.path.isdir(entry.path):  # not removed by a sweep that held the lock before us
                _remove_tree(entry.path)
                removed.append(entry.path)
        except OSError:  # locked: in use
            continue
        finally:
            os.close(lock)
    return removed


_swept: set[tuple[int, str]] = set()
_swept_lock = threading.Lock()


def _remove_orphaned_folders_once() -> None:
    """At the first run of each process (a replaced reward actor is a new process): what dead callers left."""
    key = (os.getpid(), tempfile.gettempdir())
    with _swept_lock:
        if key in _swept:
            return
        _swept.add(key)
    removed = remove_orphaned_folders(key[1])
    if removed:
        logger.info(
            "Removed %d sandbox folder(s) left by processes that died mid-run, e.g. %s.", len(removed), removed[0]
        )


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _read_capped(proc: subprocess.Popen, cap: int, deadline: float) -> tuple[bytes, bytes, str | None]:
    """Read stdout and stderr until both close, at most `cap` bytes each; kill the group when the cap or the deadline
    is passed. Returns (stdout, stderr, limit)."""
    buffers = {proc.stdout.fileno(): bytearray(), proc.stderr.fileno(): bytearray()}
    limit = None
    with selectors.DefaultSelector() as selector:
        for fd in buffers:
            selector.register(fd, selectors.EVENT_READ)
        while selector.get_map() and limit is None:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                limit = "wall_time"
                break
            for key, _ in selector.select(timeout=min(remaining, 0.5)):
                chunk = os.read(key.fd, 1 << 16)
                if not chunk:
                    selector.unregister(key.fd)
                    continue
                buffer = buffers[key.fd]
                if len(buffer) + len(chunk) > cap:
                    buffer += chunk[: cap - len(buffer)]
                    limit = "output"
                    break
                buffer += chunk
    if limit is not None:
        _kill_group(proc.pid)  # the launcher is not reaped yet: its pid (the group id) cannot have been reused
    return bytes(buffers[proc.stdout.fileno()]), bytes(buffers[proc.stderr.fileno()]), limit


def _read_status(read_fd: int) -> dict:
    status: dict = {}
    data = b""
    while chunk := os.read(read_fd, 1 << 16):
        data += chunk
    for line in data.decode(errors="replace").splitlines():
        try:
            status.update(json.loads(line))
        except ValueError:
            continue
    return status


def _classify(status: dict, stderr: str, limits: Limits, limit: str | None) -> str | None:
    if limit is not None:
        return limit
    if status.get("setup_error"):
        return "sandbox_error"
    if status.get("wall_timeout"):
        return "wall_time"
    sig = status.get("signal")
    if sig == signal.SIGXCPU or (sig == signal.SIGKILL and status.get("cpu_seconds", 0.0) >= limits.cpu_seconds):
        return "cpu_time"
    if sig == signal.SIGXFSZ or "[Errno 27] File too large" in stderr[-2000:]:  # CPython ignores SIGXFSZ
        return "file_size"
    tail = stderr[-2000:]
    if status.get("exit_code") not in (0, None) and ("MemoryError" in tail or "Cannot allocate memory" in tail):
        return "memory"
    return None


def run_program(
    source: str,
    stdin: str | bytes = "",
    limits: Limits = Limits(),
    *,
    files: dict[str, str | bytes] | None = None,
    require: Iterable[str] = (),
) -> RunResult:
    """Run the Python program `source` as `main.py` in a fresh sandbox, with `stdin` as its standard input.

    `files` are written next to it (name -> text or bytes). `require` lists isolation layers ("namespaces",
    "landlock", "seccomp", or "all") without which the run must not happen: SandboxUnavailableError is raised.
    A program that breaks a limit comes back with `limit` set; it never raises here.
    """
    protections = check_protections(require)
    _remove_orphaned_folders_once()
    python = _python()
    started = time.monotonic()
    with _owned_folder() as folder:
        os.chmod(folder, 0o700)
        Path(folder, "main.py").write_text(source, encoding="utf-8")
        for name, content in (files or {}).items():
            target = Path(folder, name)
            if target.resolve().parent != Path(folder).resolve():
                raise ValueError(f"Sandbox file name {name!r} must be a plain file name.")
            target.write_bytes(content if isinstance(content, bytes) else content.encode())
        env = _clean_env(folder)
        status_read, status_write = os.pipe()
        plan = {
            "python": python,
            "argv": [python, "-I", "-S", "-B", "main.py"],
            "env": env,
            "library_paths": _library_paths(),
            "cpu_seconds": limits.cpu_seconds,
            "wall_seconds": limits.wall_seconds,
            "memory_bytes": int(limits.memory_mb) << 20,
            "file_bytes": int(limits.max_file_bytes),
            "max_open_files": int(limits.max_open_files),
            "max_processes": None if protections.seccomp else int(limits.max_processes),
            "namespaces": protections.namespaces,
            "private_proc": protections.namespaces and protections.private_proc,
            "landlock": protections.landlock,
            "seccomp": protections.seccomp,
            "deny_processes": True,
            "status_fd": status_write,
            "caller_pid": os.getpid(),  # the launcher dies with this process
            "read_paths": _readable_paths(python),
            "write_paths": [os.path.realpath(folder), "/dev/null"],
        }
        with tempfile.TemporaryFile() as stdin_file:
            stdin_file.write(stdin.encode() if isinstance(stdin, str) else stdin)
            stdin_file.seek(0)
            try:
                proc = subprocess.Popen(
                    [python, "-I", "-S", "-B", str(LAUNCHER), json.dumps(plan)],
                    cwd=folder,
                    env=env,
                    stdin=stdin_file,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    pass_fds=(status_write,),
                    start_new_session=True,
                )
            finally:
                os.close(status_write)
            try:
                deadline = started + limits.wall_seconds + _KILL_GRACE_S
                stdout, stderr, limit = _read_capped(proc, limits.max_output_bytes, deadline)
                _kill_group(proc.pid)  # whatever the program left behind (before the launcher is reaped)
                proc.wait()
                status = _read_status(status_read)
            finally:
                os.close(status_read)
                proc.stdout.close()
                proc.stderr.close()
    stdout_text = stdout.decode("utf-8", errors="replace")
    stderr_text = stderr.decode("utf-8", errors="replace")
    limit = _classify(status, stderr_text, limits, limit)
    return RunResult(
        stdout=stdout_text,
        stderr=stderr_text,
        exit_code=status.get("exit_code") if limit != "sandbox_error" else None,
        signal=status.get("signal"),
        limit=limit,
        wall_seconds=time.monotonic() - started,
        cpu_seconds=float(status.get("cpu_seconds", 0.0)),
        error=status.get("setup_error", ""),
    )
