"""CPU budgets: which cores a process (and the processes it starts) may use, and how many threads that gives.

    --cpus 0-3,8      a Linux CPU list (the format of taskset -c and /proc/self/status Cpus_allowed_list)

Why: a vLLM backend and a frontend on one machine each size their OpenMP pools as if they owned every core.
With both pools on the same cores their threads take turns at every parallel region's barrier and both
slow down; on disjoint cores the LM decode and the flow/HiFT work run side by side. The budget is applied
with sched_setaffinity, which every child inherits (the frontend's workers, vLLM's engine processes), and
the thread counts follow the cores a process may use (not the machine's count).
"""
from __future__ import annotations

import os
import threading
from collections.abc import Iterator, Mapping, MutableMapping
from contextlib import contextmanager

__all__ = ["allowed_cpus", "format_cpus", "lower_priority", "lowest_nice", "parse_cpus", "pin", "priority_refusal",
           "sleep_idle_threads", "usable_cores", "worker_thread_env", "worker_threads"]

# Thread counts that libraries read from the environment as they load, each the operator's total for a process
# and the processes it starts: OpenMP's (torch, and OpenBLAS and MKL without their own), OpenBLAS's, MKL's.
THREAD_COUNT_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
# The OpenMP variables that say how an idle thread waits; any of them set is the operator's choice.
OPENMP_WAIT_VARS = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "KMP_BLOCKTIME")

MAX_NICE = 19
MIN_NICE = -20
CAP_SYS_NICE = 23  # linux/capability.h: the capability to raise priorities


def parse_cpus(text: str) -> list[int]:
    """'0-2,5' -> [0, 1, 2, 5]; ValueError naming what is wrong."""
    cpus: set[int] = set()
    for part in text.replace(" ", "").split(","):
        if not part:
            raise ValueError(f"CPU list {text!r}: an empty item")
        lo, _, hi = part.partition("-")
        try:
            first, last = int(lo), int(hi or lo)
        except ValueError:
            raise ValueError(f"CPU list {text!r}: {part!r} is not a number or a range a-b") from None
        if first < 0 or last < first:
            raise ValueError(f"CPU list {text!r}: {part!r} is not an ascending range of CPU ids")
        cpus.update(range(first, last + 1))
    return sorted(cpus)


def format_cpus(cpus: list[int]) -> str:
    """[0, 1, 2, 5] -> '0-2,5'."""
    out, run = [], []
    for c in sorted(set(cpus)):
        if run and c != run[-1] + 1:
            out.append(_run(run))
            run = []
        run.append(c)
    if run:
        out.append(_run(run))
    return ",".join(out)


def _run(run: list[int]) -> str:
    return str(run[0]) if len(run) == 1 else f"{run[0]}-{run[-1]}"


def allowed_cpus() -> list[int]:
    """The CPUs this process may run on (a container's cpuset or an earlier pin included)."""
    return sorted(os.sched_getaffinity(0))


def usable_cores() -> int:
    return len(os.sched_getaffinity(0)) or 1


def _count(env: Mapping[str, str], name: str) -> int:
    """A thread-count variable's value; 0 when unset or not a positive number."""
    try:
        return max(int(env.get(name, "")), 0)
    except ValueError:
        return 0


def worker_threads(n_workers: int) -> int:
    """Threads for each of `n_workers` processes sharing this process's cores: an equal share of
    OMP_NUM_THREADS when it is set (the operator's total: container platforms set it to the CPU limit), else
    of the usable cores; at least 1."""
    total = _count(os.environ, "OMP_NUM_THREADS") or usable_cores()
    return max(1, total // n_workers)


def worker_thread_env(threads: int, n_workers: int, env: Mapping[str, str] = os.environ) -> dict[str, str]:
    """The thread-count variables for one of `n_workers` processes started from `env`, each computing with
    `threads` threads: OMP_NUM_THREADS is `threads`, OPENBLAS_NUM_THREADS and MKL_NUM_THREADS (where set) an
    equal share of their totals. A process's OpenMP, OpenBLAS and MKL size their pools from these as they load,
    before its `torch.set_num_threads` can act: passed whole, N processes would each start the full count."""
    out = {"OMP_NUM_THREADS": str(threads)}
    for name in THREAD_COUNT_VARS[1:]:
        if total := _count(env, name):
            out[name] = str(max(1, total // n_workers))
    return out


_ENVIRON = threading.Lock()  # one `spawn_environment` at a time


@contextmanager
def spawn_environment(changes: dict[str, str]) -> Iterator[None]:
    """os.environ with `changes` while a worker process starts: multiprocessing's spawn has no environment of
    its own to give, and the worker's libraries read theirs (`worker_thread_env`) before any code of ours runs
    there (its unpickling imports the parent's main module). Restored at once."""
    with _ENVIRON:
        saved = {name: os.environ.get(name) for name in changes}
        os.environ.update(changes)
        try:
            yield
        finally:
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value


def sleep_idle_threads(env: MutableMapping[str, str]) -> None:
    """Have the OpenMP threads of processes started with `env` sleep when they run out of work, not spin.

    torch's OpenMP (libgomp) keeps a thread that reaches the end of a parallel region spinning on its core for some
    300,000 turns before it sleeps. A process alone on its cores gains from that (the next region starts at once:
    bench/lm_throughput.py --start_backend measures it), but a vLLM backend and a frontend's worker sharing cores,
    or an LM thread and the flow thread of one worker, each spin on the cores the other needs, and a stream's first
    chunk comes later (bench/split_timeline.py measures it). Called for processes that share their cores with an LM
    (the backend with --nice or on the loopback, the workers of a frontend whose LM is on this machine). libgomp
    reads the variable once, when it loads: set it in the environment of a process before it imports torch. An
    operator's own setting (OMP_WAIT_POLICY, GOMP_SPINCOUNT or KMP_BLOCKTIME) is kept.
    """
    if not any(name in env for name in OPENMP_WAIT_VARS):
        env["OMP_WAIT_POLICY"] = "PASSIVE"


def pin(text: str) -> list[int]:
    """Restrict this process (and its future children) to the CPU list `text`; ValueError when the list
    names CPUs this process may not use."""
    cpus = parse_cpus(text)
    allowed = allowed_cpus()
    if missing := [c for c in cpus if c not in allowed]:
        raise ValueError(f"--cpus {text}: CPU(s) {format_cpus(missing)} are not available here "
                         f"(this process may use {format_cpus(allowed)})")
    os.sched_setaffinity(0, cpus)
    return cpus


def lowest_nice() -> int:
    """The lowest nice value (highest priority) this process may take: MIN_NICE with CAP_SYS_NICE (root),
    else 20 - RLIMIT_NICE's soft limit (`ulimit -e`; 0 by default: no raising at all). Keeping or raising a
    nice value is always allowed."""
    try:
        with open("/proc/self/status") as f:
            caps = next(line.split()[1] for line in f if line.startswith("CapEff:"))
        if int(caps, 16) >> CAP_SYS_NICE & 1:
            return MIN_NICE
    except (OSError, StopIteration, ValueError):  # no /proc (not Linux): root may, others may not
        return MIN_NICE if os.geteuid() == 0 else MAX_NICE + 1
    import resource
    soft = resource.getrlimit(resource.RLIMIT_NICE)[0]
    return MIN_NICE if soft == resource.RLIM_INFINITY else max(MIN_NICE, 20 - soft)


def priority_refusal(n: int, current: int | None = None, lowest: int | None = None) -> str | None:
    """Why this process cannot take nice value `n` (None: it can). A value below its `current` one (default:
    its own) raises its priority, which Linux allows down to `lowest` only (default: `lowest_nice()`)."""
    current = os.nice(0) if current is None else current
    lowest = lowest_nice() if lowest is None else lowest
    if n >= min(current, lowest):
        return None
    return (f"nice {n}: this process runs at nice {current}, and a lower nice value (a higher priority) needs "
            f"CAP_SYS_NICE (root) or RLIMIT_NICE {20 - n} or more (ulimit -e): ask for {min(current, lowest)} "
            f"or more, or start it at nice {n} or below")


def lower_priority(n: int) -> None:
    """Give this process (and its future children) CPU priority nice `n` (0..19) against every other process.

    A plain nice value is not enough on Linux: with autogroups (`/proc/sys/kernel/sched_autogroup_enabled`)
    the scheduler first shares the CPU between sessions, and nice only orders processes inside one session, so
    a niced server started in its own session (as the backend starts vLLM) still gets half of a 2-core machine
    against a frontend. The session's autogroup gets the same nice value (`/proc/self/autogroup`). ValueError
    (`priority_refusal`'s reason) for a value this process may not take."""
    if not 0 <= n <= MAX_NICE:
        raise ValueError(f"nice {n}: must be 0..{MAX_NICE}")
    if why := priority_refusal(n):
        raise ValueError(why)
    os.nice(n - os.nice(0))
    try:
        with open("/proc/self/autogroup", "w") as f:  # absent without autogroups, or off Linux
            f.write(str(n))
    except OSError:
        pass
