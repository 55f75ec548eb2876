"""The process that puts one untrusted program in its sandbox (started by sandbox.py; not imported by easyrl).

It runs as `python -I -S -B sandbox_launcher.py PLAN_JSON` with a cleared environment, in a new session, with the
program's directory as its working directory, and writes JSON status lines to the pipe the plan names (`status_fd`). Only the
standard library is imported, plus `landlock` and `pyseccomp` from the folders the plan names (so no site-packages
`.pth` hook runs in here). Steps, each one only when the plan asks for it (sandbox.py decides from the host probe):

    launcher  die with the caller (see below)
              rlimits that do not stop the launcher itself (CPU, file size, open files, core dumps)
              unshare(user, network, pid, mount, ipc, uts namespaces)
              fork ->  init (pid 1 of the new pid namespace): die with the launcher, mount a private /proc, then
                       fork ->  program: die with init, rlimits (address space, processes), Landlock, seccomp,
                                         execve(python -I -S -B main.py)
                       wait for the program; report its exit status; exit (the kernel kills whatever is left)
              wait for init until the wall deadline, then SIGKILL it (which ends the whole pid namespace)

Without namespaces the launcher forks the program directly (which dies with the launcher) and waits for it the same
way. `--probe` tries every step once in throwaway children and prints what this host supports.

Dying with the caller: the caller (a reward actor) may be SIGKILLed mid-run (Ray replaces an actor past
`worker.reward.timeout_s`), and the launcher, in its own session, would then be re-parented and run on with the
program until the wall limit. So the launcher asks the kernel for SIGTERM when its caller exits (PR_SET_PDEATHSIG),
then checks that its parent is still the caller (one that died before the request went unnoticed otherwise), and
on SIGTERM SIGKILLs its whole process group: itself, init and the program (their pid namespace with them), and
without namespaces the program's own children too. Each child also dies with its parent, checked the same way
through a pipe only the parent holds open (init cannot see its parent's pid), for a launcher killed alone.
"""

import ctypes
import errno
import json
import os
import resource
import select
import signal
import sys
import time


SETUP_FAILED = 125  # exit status of a launcher or child that could not apply a protection the plan asked for

CLONE_NEWNS = 0x00020000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
CLONE_THREAD = 0x00010000
NAMESPACES = CLONE_NEWUSER | CLONE_NEWNET | CLONE_NEWPID | CLONE_NEWNS | CLONE_NEWIPC | CLONE_NEWUTS
MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REC, MS_PRIVATE = 2, 4, 8, 1 << 14, 1 << 18
PR_SET_PDEATHSIG = 1

# Syscalls a test program never needs that widen the kernel's attack surface or reach outside the sandbox. Process
# creation is refused separately (fork bombs); sockets are refused outright (no network, no host UNIX sockets).
DENIED_SYSCALLS = (
    "ptrace", "process_vm_readv", "process_vm_writev", "kcmp", "pidfd_open", "pidfd_getfd", "setns", "unshare",
    "mount", "umount2", "pivot_root", "chroot", "move_mount", "open_tree", "fsopen", "fsmount", "fsconfig",
    "keyctl", "add_key", "request_key", "bpf", "perf_event_open", "userfaultfd", "io_uring_setup",
    "io_uring_enter", "io_uring_register", "init_module", "finit_module", "delete_module", "kexec_load",
    "kexec_file_load", "reboot", "swapon", "swapoff", "acct", "quotactl", "open_by_handle_at",
    "name_to_handle_at", "settimeofday", "clock_settime", "clock_adjtime", "adjtimex", "syslog", "vhangup",
    "iopl", "ioperm", "lookup_dcookie", "socket", "socketpair",
)  # fmt: skip
PROCESS_CREATION = ("fork", "vfork")

_libc = ctypes.CDLL(None, use_errno=True)


def _check(result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def unshare_namespaces() -> None:
    _check(_libc.unshare(NAMESPACES), "unshare(user, net, pid, mount, ipc, uts)")


def mount_private_proc() -> None:
    """In the new mount and pid namespaces: stop mounts propagating back, then a /proc showing only this sandbox."""
    _check(_libc.mount(None, b"/", None, MS_REC | MS_PRIVATE, None), "make / a private mount")
    _check(_libc.mount(b"proc", b"/proc", b"proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, None), "mount /proc")


def die_with_caller(caller_pid: int) -> None:
    """SIGTERM (then a SIGKILL of the whole group) when the process that started the launcher exits."""
    signal.signal(signal.SIGTERM, lambda _signum, _frame: os.killpg(0, signal.SIGKILL))
    _check(_libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0), "prctl(PR_SET_PDEATHSIG)")
    if os.getppid() != caller_pid:  # the caller died before the request: no signal will come
        os.killpg(0, signal.SIGKILL)


def die_with_parent(lifeline: int | None) -> None:
    """SIGKILL when the parent exits. `lifeline` is the read end of a pipe whose write end only the parent holds:
    already at end of file when the parent died before the request."""
    _check(_libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "prctl(PR_SET_PDEATHSIG)")
    if lifeline is not None and select.select([lifeline], [], [], 0)[0]:
        os._exit(SETUP_FAILED)


def apply_landlock(read_paths: list[str], write_paths: list[str]) -> None:
    """Landlock (Linux >= 5.13): from here on this process and its children reach only the listed paths."""
    from landlock import FSAccess, Ruleset

    ruleset = Ruleset()  # handles every filesystem access right the kernel knows
    read_rights = FSAccess.READ_FILE | FSAccess.READ_DIR | FSAccess.EXECUTE
    file_rights = FSAccess.all_file()
    for path in read_paths:
        if os.path.exists(path):
            ruleset.allow(path, rules=read_rights if os.path.isdir(path) else read_rights & file_rights)
    for path in write_paths:
        ruleset.allow(path, rules=FSAccess.all() if os.path.isdir(path) else file_rights)
    ruleset.apply()  # sets no_new_privs first


def apply_seccomp(deny_processes: bool) -> None:
    """A seccomp filter (libseccomp through pyseccomp): the calls above fail with EPERM, so do signals to other
    processes and process creation."""
    import pyseccomp as seccomp

    syscall_filter = seccomp.SyscallFilter(seccomp.ALLOW)
    for name in DENIED_SYSCALLS:
        try:
            syscall_filter.add_rule(seccomp.ERRNO(errno.EPERM), name)
        except (OSError, ValueError):
            pass  # a call this architecture or libseccomp does not know cannot be made either
    # signals only to itself (its threads included): no kill(-1), nothing to the launcher, the trainer or others
    own_pid = os.getpid()  # execve keeps the pid
    for name in ("kill", "tgkill", "rt_sigqueueinfo", "rt_tgsigqueueinfo"):
        syscall_filter.add_rule(seccomp.ERRNO(errno.EPERM), name, seccomp.Arg(0, seccomp.NE, own_pid))
    syscall_filter.add_rule(seccomp.ERRNO(errno.EPERM), "tkill")
    if deny_processes:
        for name in PROCESS_CREATION:
            syscall_filter.add_rule(seccomp.ERRNO(errno.EPERM), name)
        # threads (CLONE_THREAD) stay allowed: CPython and the program may start them
        syscall_filter.add_rule(
            seccomp.ERRNO(errno.EPERM), "clone", seccomp.Arg(0, seccomp.MASKED_EQ, CLONE_THREAD, 0)
        )
        # clone3 passes its flags in memory, out of a filter's sight: ENOSYS makes libc fall back to clone
        syscall_filter.add_rule(seccomp.ERRNO(errno.ENOSYS), "clone3")
    syscall_filter.load()


def set_limit(name: str, value: int) -> None:
    limit = getattr(resource, name)
    _soft, hard = resource.getrlimit(limit)
    if hard != resource.RLIM_INFINITY and value > hard:
        value = hard  # never above what the launcher was given
    resource.setrlimit(limit, (value, value))


_status_fd = [-1]  # the plan's status pipe


def write_status(status: dict) -> None:
    try:
        os.write(_status_fd[0], (json.dumps(status) + "\n").encode())
    except OSError:
        pass


def exec_program(plan: dict, lifeline: int | None) -> None:
    """In the program's process: the last restrictions, then replace this process by the program."""
    try:
        die_with_parent(lifeline)
        if plan["seccomp"]:
            import pyseccomp  # noqa: F401 - now: it locates libseccomp by running ldconfig, which Landlock then stops
        set_limit("RLIMIT_AS", plan["memory_bytes"])
        if plan.get("max_processes") is not None:
            set_limit("RLIMIT_NPROC", plan["max_processes"])
        if plan["landlock"]:
            apply_landlock(plan["read_paths"], plan["write_paths"])
        if plan["seccomp"]:
            apply_seccomp(plan["deny_processes"])
        os.closerange(3, resource.getrlimit(resource.RLIMIT_NOFILE)[0])  # the status pipe too
        os.execve(plan["python"], plan["argv"], plan["env"])
    except BaseException as err:  # report why, then never run the program unprotected
        write_status({"setup_error": f"{type(err).__name__}: {err}"})
        os._exit(SETUP_FAILED)


def wait_status(pid: int) -> dict:
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        return {"exit_code": None, "signal": os.WTERMSIG(status)}
    return {"exit_code": os.WEXITSTATUS(status), "signal": None}


def run_init(plan: dict, lifeline: int) -> None:
    """pid 1 of the sandbox: owns the namespace; when it exits the kernel kills every process left in it."""
    try:
        die_with_parent(lifeline)
        if plan["private_proc"]:
            mount_private_proc()
    except BaseException as err:
        write_status({"setup_error": f"{type(err).__name__}: {err}"})
        os._exit(SETUP_FAILED)
    pid = os.fork()
    if pid == 0:
        exec_program(plan, None)  # no race to check: when init exits, the kernel kills every process it holds
    write_status(wait_status(pid))
    os._exit(0)


def launch(plan: dict) -> int:
    _status_fd[0] = plan["status_fd"]
    sys.path[:0] = plan["library_paths"]
    deadline = time.monotonic() + plan["wall_seconds"]
    try:
        die_with_caller(plan["caller_pid"])
        set_limit("RLIMIT_CORE", 0)
        set_limit("RLIMIT_NOFILE", plan["max_open_files"])
        set_limit("RLIMIT_FSIZE", plan["file_bytes"])
        # the soft limit sends SIGXCPU, the hard limit one second later SIGKILL (a program may catch SIGXCPU)
        cpu = max(1, int(plan["cpu_seconds"] + 0.999))
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
        if plan["namespaces"]:
            unshare_namespaces()
    except BaseException as err:
        write_status({"setup_error": f"{type(err).__name__}: {err}"})
        return SETUP_FAILED
    lifeline, kept_open = os.pipe()  # `kept_open` closes only when the launcher exits
    pid = os.fork()
    if pid == 0:
        os.close(kept_open)
        run_init(plan, lifeline) if plan["namespaces"] else exec_program(plan, lifeline)
    os.close(lifeline)
    timed_out = []

    def on_deadline(_signum, _frame):
        timed_out.append(True)
        os.kill(pid, signal.SIGKILL)

    signal.signal(signal.SIGALRM, on_deadline)
    signal.setitimer(signal.ITIMER_REAL, max(0.001, deadline - time.monotonic()))
    status = wait_status(pid)
    signal.setitimer(signal.ITIMER_REAL, 0)
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    extra = {"cpu_seconds": usage.ru_utime + usage.ru_stime, "max_rss_kb": usage.ru_maxrss}
    if timed_out:
        extra["wall_timeout"] = True
    write_status(extra if plan["namespaces"] else {**status, **extra})  # with namespaces, init reported the status
    return 0


# ----------------------------------------------------------------------------------------------------------------------
# --probe: what this host supports, each step tried in a throwaway child
# ----------------------------------------------------------------------------------------------------------------------
def _try_in_child(step) -> str | None:
    """None when `step()` succeeds in a forked child, else why it failed."""
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_fd)
        try:
            step()
            os._exit(0)
        except BaseException as err:
            os.write(write_fd, f"{type(err).__name__}: {err}".encode()[:500])
            os._exit(1)
    os.close(write_fd)
    message = b""
    while chunk := os.read(read_fd, 4096):
        message += chunk
    os.close(read_fd)
    status = wait_status(pid)
    return None if status["exit_code"] == 0 else (message.decode(errors="replace") or f"exit status {status}")


def _namespaces_and_proc() -> None:
    unshare_namespaces()
    pid = os.fork()  # the first child in the new pid namespace: where /proc is mounted
    if pid == 0:
        try:
            mount_private_proc()
            os._exit(0 if os.listdir("/proc") and os.getpid() == 1 else 3)
        except BaseException:
            os._exit(4)
    status = wait_status(pid)
    if status["exit_code"] != 0:
        raise OSError(f"namespaces work but a private /proc cannot be mounted (child status {status})")


def _landlock_version() -> int:
    import landlock

    return int(landlock.landlock_abi_version())


def probe(library_paths: list[str]) -> dict:
    sys.path[:0] = library_paths
    result = {"namespaces": _try_in_child(unshare_namespaces)}
    result["private_proc"] = _try_in_child(_namespaces_and_proc) if result["namespaces"] is None else "no namespaces"
    try:
        result["landlock_abi"] = _landlock_version()
        result["landlock"] = _try_in_child(lambda: apply_landlock([], [os.getcwd()]))
    except ImportError:
        result["landlock_abi"], result["landlock"] = 0, "the `landlock` package is not installed"
    except Exception as err:  # the kernel has no Landlock
        result["landlock_abi"], result["landlock"] = 0, f"{type(err).__name__}: {err}"
    try:
        import pyseccomp  # noqa: F401

        result["seccomp"] = _try_in_child(lambda: apply_seccomp(deny_processes=True))
    except (ImportError, OSError, RuntimeError) as err:
        result["seccomp"] = f"`pyseccomp` or libseccomp is missing ({type(err).__name__}: {err})"
    result["root"] = os.geteuid() == 0
    return result


def main() -> int:
    if sys.argv[1] == "--probe":
        print(json.dumps(probe(json.loads(sys.argv[2]))))
        return 0
    return launch(json.loads(sys.argv[1]))


if __name__ == "__main__":
    sys.exit(main())
