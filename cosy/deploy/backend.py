"""The backend: the speech-token LM of a model directory served by vLLM's OpenAI-compatible server.

    python launch/backend.py --model_dir DIR --api_key KEY [--port 8000] [-- extra vLLM flags]

Exports llm.pt (cached, `cosy.lm.export`), starts `python -m cosy.vllm_plugin.serve` (vLLM's server) as a
child in its own process group, forwards SIGINT/SIGTERM to it, waits for /health, sends one warm-up
completion, then prints exactly one line `cosy backend ready: http://HOST:PORT/v1` to stdout. vLLM's log
goes to stderr. Exits with the child's status; if the child dies before it is ready, its last log lines are
printed with the reason and the exit status is non-zero. vLLM's temp files go into the backend's own
`$TMPDIR/cosy-backend-<pid>`, removed when it ends (a killed backend's, by the next one to start here).
"""
from __future__ import annotations

import argparse
import base64
import collections
import ctypes
import io
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from importlib.metadata import entry_points
from pathlib import Path

import torch

from cosy.deploy.cpus import (
    MAX_NICE,
    format_cpus,
    lower_priority,
    parse_cpus,
    pin,
    priority_refusal,
    sleep_idle_threads,
)
from cosy.deploy.gpu_memory import HEADROOM, gpu_total_bytes, kv_cache_bytes, memory_share, weight_bytes
from cosy.deploy.hosts import is_loopback
from cosy.deploy.temp_root import TempRoot
from cosy.lm.export import WEIGHTS, export_for_vllm, llm_fingerprint, served_model_name
from cosy.model.files import ModelDir, ModelDirError
from cosy.model.precision import backend_dtype
from cosy.vllm_plugin import KEEPALIVE, LOGITS_PROCESSOR

API_KEY_ENV = "COSY_LLM_API_KEY"
PLUGIN = "cosy.vllm_plugin:register"
LOG_TAIL = 40  # child log lines kept for the error message
TEMP_PREFIX = "cosy-backend-"  # this backend's temp dir, vLLM's TMPDIR (`temp_env`)


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """Our flags, and everything after `--` (passed to vLLM unchanged)."""
    extra: list[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, extra = argv[:i], argv[i + 1:]
    p = build_parser()
    args = p.parse_args(argv)
    return _checked(p, args, argv), extra


def build_parser() -> argparse.ArgumentParser:
    """launch/backend.py's flags (the docs' flags reference is generated from this parser)."""
    p = argparse.ArgumentParser(prog="python launch/backend.py", description=__doc__.split("\n\n")[0],
                                epilog="Arguments after `--` are passed to vLLM's server unchanged.")
    p.add_argument("--model_dir", required=True, help="CosyVoice2 or CosyVoice3 model directory (local path)")
    p.add_argument("--llm_variant", default=None,
                   help="LM checkpoint: default (llm.pt) or rl (CosyVoice3: llm.rl.pt, RL-tuned)")
    p.add_argument("--host", default="0.0.0.0",
                   help="address to listen on (a loopback address: only frontends of this machine can reach it)")
    p.add_argument("--port", type=int, default=8000, help="port of the OpenAI-compatible server")
    p.add_argument("--api_key", default=os.environ.get(API_KEY_ENV),
                   help=f"key clients must send (default: ${API_KEY_ENV}); required unless --no_api_key")
    p.add_argument("--api_key_file", default=None,
                   help="read the key from this file (trailing newline stripped; keeps it out of ps)")
    p.add_argument("--no_api_key", action="store_true", help="serve without authentication")
    p.add_argument("--dtype", default=None,
                   help="float32 on CPU, bfloat16 on GPU by default; auto: bfloat16 where the CPU or GPU has "
                        "bfloat16 units, float32 elsewhere (logged at start-up); other names go to vLLM")
    p.add_argument("--gpu_memory_utilization", type=float, default=None,
                   help="fraction of GPU memory vLLM may take (vLLM's own default, about 0.9, starves frontends "
                        "on the same GPU); default: none, the KV cache is sized by --kv_cache_gib instead")
    p.add_argument("--kv_cache_gib", type=float, default=None,
                   help="GPU KV cache in GiB (vLLM --kv-cache-memory-bytes); default: what max_num_seqs sequences "
                        "of max_model_len tokens need (about 3 GiB for CosyVoice2 in bfloat16 at 64 x 4096)")
    p.add_argument("--cpus", default=None,
                   help="CPU only: the CPU list vLLM runs on, its OpenMP threads one per listed CPU, e.g. 0 "
                        "(default: every CPU, $OMP_NUM_THREADS threads when set); on one machine "
                        "with frontends give each its own cores (docs: Deployment, One machine)")
    p.add_argument("--nice", type=int, default=0,
                   help=f"lower vLLM's CPU priority to this nice value (1..{MAX_NICE}), for one machine shared "
                        "with frontends: their flow work then comes first; 5 does it, 19 starves vLLM once the "
                        "frontends are saturated (docs: Deployment, One machine)")
    p.add_argument("--max_num_seqs", type=int, default=None, help="16 on CPU, 64 on GPU by default")
    p.add_argument("--scheduling_policy", choices=("priority", "fcfs"), default="priority",
                   help="vLLM's queue: priority (default: each request's priority class, sent by the frontends, "
                        "then arrival; a request is preempted only for a more urgent one) or fcfs (arrival only)")
    p.add_argument("--max_model_len", type=int, default=None, help="2048 on CPU, 4096 on GPU by default")
    p.add_argument("--cache_dir", default=None, help="writable export cache (default $COSY_CACHE or ~/.cache/cosy)")
    p.add_argument("--start_timeout", type=float, default=1800.0, help="seconds to wait for the server")
    return p


def _checked(p: argparse.ArgumentParser, args: argparse.Namespace, argv: list[str]) -> argparse.Namespace:
    """The parsed flags checked together (p.error exits with a usage error naming the problem)."""
    if args.api_key_file is not None:
        from cosy.deploy.keyfile import KeyFileError, read_key_file
        if "--api_key" in argv:
            p.error("give --api_key or --api_key_file, not both")
        try:
            args.api_key = read_key_file(args.api_key_file, "--api_key_file")
        except KeyFileError as e:
            p.error(str(e))
    if args.no_api_key:
        args.api_key = None
    elif not args.api_key:
        p.error(f"--api_key, --api_key_file (or ${API_KEY_ENV}) is required; pass --no_api_key to serve without one")
    if args.cpus is not None:
        try:
            parse_cpus(args.cpus)
        except ValueError as e:
            p.error(f"--cpus: {e}")
    if not 0 <= args.nice <= MAX_NICE:
        p.error(f"--nice {args.nice}: must be 0..{MAX_NICE}")
    if args.nice and (why := priority_refusal(args.nice)):  # else the child fails in preexec_fn, unexplained
        p.error(f"--{why}")
    return args


def vllm_command(args: argparse.Namespace, export_dir: Path, name: str, gpu: bool, extra: list[str],
                 gpu_total: int | None = None) -> tuple[list[str], dict[str, str]]:
    """The child's argv and environment. The key travels in the environment, never on a command line.
    `gpu_total`: the card's bytes (`gpu_memory.gpu_total_bytes`), for the share that a fixed KV cache needs."""
    cmd = [sys.executable, "-m", "cosy.vllm_plugin.serve", "--model", str(export_dir),
           "--served-model-name", name, "--host", args.host, "--port", str(args.port),
           "--dtype", backend_dtype(args.dtype, gpu)[0],
           "--max-model-len", str(args.max_model_len or (4096 if gpu else 2048)),
           "--max-num-seqs", str(args.max_num_seqs or (64 if gpu else 16)),
           # text and voice prompt arrive as embeddings; outputs are ids: no tokenizer, no generation config
           "--skip-tokenizer-init", "--enable-prompt-embeds", "--generation-config", "vllm",
           # named here, not as an entry point: only then does vLLM keep output ids exact for it
           "--logits-processors", LOGITS_PROCESSOR,
           # a request queued past --max-num-seqs sends SSE comments until its first token: not a stall
           "--middleware", KEEPALIVE,
           # the frontends send each request's class as vLLM's `priority` (cosy.lm.call): a listener's stream
           # is not queued behind bulk work
           "--scheduling-policy", getattr(args, "scheduling_policy", "priority")]
    if args.gpu_memory_utilization is not None:
        cmd += ["--gpu-memory-utilization", str(args.gpu_memory_utilization)]
    if gpu and (args.kv_cache_gib is not None or args.gpu_memory_utilization is None):
        # a fixed KV budget instead of a share of the GPU: the weights (1 GiB) plus this is all vLLM takes
        size = (int(args.kv_cache_gib * 2 ** 30) if args.kv_cache_gib is not None else
                kv_cache_bytes(export_dir, cmd[cmd.index("--dtype") + 1], int(cmd[cmd.index("--max-num-seqs") + 1]),
                               int(cmd[cmd.index("--max-model-len") + 1])))
        cmd += ["--kv-cache-memory-bytes", str(size)]
        if args.gpu_memory_utilization is None and gpu_total:  # vLLM checks free memory against a share
            need = weight_bytes(export_dir / WEIGHTS, cmd[cmd.index("--dtype") + 1]) + size + HEADROOM
            cmd += ["--gpu-memory-utilization", str(memory_share(need, gpu_total))]
    if not gpu:
        cmd.append("--enforce-eager")  # torch.compile on CPU costs minutes at start for little gain
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env.pop("VLLM_API_KEY", None)
    if args.api_key:
        env["VLLM_API_KEY"] = args.api_key
    if not gpu:
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")  # GiB of KV cache
        # the model runs inside the engine process (vLLM's uniprocess executor), not in a worker process
        # beside it: one vLLM and torch import fewer per start (32 -> 21 CPU seconds on the tiny model), one
        # process's memory fewer, no per-step hop between the two, and no core kept for an engine that only
        # schedules (same tokens/s at the same thread count, measured). vllm-cpu forces its multiprocess
        # executor only while this is on; set it to 1 to have that back.
        env.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        if args.nice or is_loopback(args.host):  # it shares this machine's cores with its frontends (only
            sleep_idle_threads(env)  # those can reach a loopback address): idle threads leave them the cores
        if args.cpus:  # one OpenMP thread per listed CPU (the process is pinned to them); vLLM's own binding
            cpus = parse_cpus(args.cpus)  # of its multiprocess executor, for VLLM_ENABLE_V1_MULTIPROCESSING=1
            env["OMP_NUM_THREADS"] = str(len(cpus))
            env["VLLM_CPU_OMP_THREADS_BIND"] = format_cpus(cpus)
    return cmd + extra, env


def _die_with_parent() -> None:
    """In the child before exec: get SIGTERM if the backend dies without forwarding a signal (Linux)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


class Child:
    """vLLM's server process: its own session and process group, its log copied to our stderr with a tail
    kept; `nice` > 0: at that CPU priority (set in the new session, so its autogroup gets it too; ValueError
    before anything starts when this process may not take it)."""

    def __init__(self, cmd: list[str], env: dict[str, str], nice: int = 0):
        if nice and (why := priority_refusal(nice)):
            raise ValueError(why)

        def before_exec() -> None:
            if sys.platform == "linux":
                _die_with_parent()
            if nice:
                lower_priority(nice)

        self.proc = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=before_exec)
        self.tail: collections.deque[str] = collections.deque(maxlen=LOG_TAIL)
        self._reader = threading.Thread(target=self._copy_log, daemon=True)
        self._reader.start()

    def _copy_log(self) -> None:
        for raw in self.proc.stdout:  # always drained: a full pipe would stall vLLM
            line = raw.decode("utf-8", "replace")
            self.tail.append(line.rstrip("\n"))
            try:
                sys.stderr.write(line)
                sys.stderr.flush()
            except (OSError, ValueError):  # our stderr is gone; keep draining
                pass

    def signal(self, sig: int) -> None:
        try:
            os.killpg(self.proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def stop(self, grace: float = 30.0) -> int:
        """SIGTERM the group, SIGKILL it after `grace` seconds; the exit status."""
        self.signal(signal.SIGTERM)
        try:
            self.proc.wait(grace)
        except subprocess.TimeoutExpired:
            self.signal(signal.SIGKILL)
            self.proc.wait()
        return self.returncode()

    def returncode(self) -> int:
        rc = self.proc.wait()
        self._reader.join(timeout=5)  # the rest of the log
        return 128 - rc if rc < 0 else rc  # killed by signal N -> 128 + N, as shells report it


def _request(url: str, api_key: str | None, body: dict | None = None, timeout: float = 5.0) -> int:
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers=headers, method="GET" if body is None else "POST")
    with urllib.request.urlopen(req, timeout=timeout) as r:
        r.read()
        return r.status


def warmup_body(export_dir: Path, name: str, rows: int = 4) -> dict:
    """A 2-token greedy completion from a few random rows of the speech embedding. No request of the
    frontends asks for log-probs (vLLM compiles that path on the first request that does, which a first
    duplex task once waited for: `cosy.lm.bistream_steps` records them only to verify), so none is warmed."""
    from safetensors import safe_open

    with safe_open(str(export_dir / WEIGHTS), framework="pt") as f:
        table = f.get_tensor("model.embed_tokens.weight")
    idx = torch.randint(0, table.size(0) - 3, (rows,), generator=torch.Generator().manual_seed(0))
    buf = io.BytesIO()
    torch.save(table[idx].clone(), buf)
    return {"model": name, "prompt_embeds": base64.b64encode(buf.getvalue()).decode(), "max_tokens": 2,
            "temperature": 0.0}


def wait_ready(child: Child, base: str, api_key: str | None, warmup: dict, timeout: float) -> str | None:
    """None once /health answers and the warm-up completion succeeded; else why not."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if child.proc.poll() is not None:
            return f"vLLM's server exited with status {child.returncode()} before it was ready"
        try:
            if _request(base + "/health", None) == 200:
                break
        except (OSError, urllib.error.URLError):
            pass
        time.sleep(0.5)
    else:
        return f"vLLM's server did not answer /health within {timeout:.0f} s"
    try:
        _request(base + "/v1/completions", api_key, warmup, timeout=max(deadline - time.monotonic(), 30.0))
    except (OSError, urllib.error.URLError) as e:
        detail = e.read().decode("utf-8", "replace")[:500] if isinstance(e, urllib.error.HTTPError) else e
        return f"the warm-up completion failed: {detail}"
    return None


def _url_host(host: str) -> str:
    if host in ("", "0.0.0.0"):
        return "127.0.0.1"
    if host == "::":
        return "[::1]"
    return f"[{host}]" if ":" in host else host


def main(argv: list[str] | None = None) -> int:
    args, extra = parse_args(sys.argv[1:] if argv is None else argv)
    if not Path(args.model_dir).expanduser().is_dir():
        print(f"error: model directory {args.model_dir} does not exist (give a local CosyVoice2 model "
              "directory)", file=sys.stderr)
        return 2
    if not any(ep.value == PLUGIN for ep in entry_points(group="vllm.general_plugins")):
        print(f"error: cosy's vLLM plugin ({PLUGIN}) is not registered: install cosy with "
              "`pip install -e .` (or `pip install .`)", file=sys.stderr)
        return 2
    try:
        export_dir = export_for_vllm(args.model_dir, args.cache_dir, args.llm_variant)
        name = served_model_name(llm_fingerprint(args.model_dir, args.cache_dir, args.llm_variant),
                                 ModelDir(args.model_dir).family)
    except (ModelDirError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    gpu = torch.cuda.is_available()
    if args.cpus and not gpu:
        try:
            pin(args.cpus)  # vLLM's server, engine and worker processes inherit it
        except ValueError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
    cmd, env = vllm_command(args, export_dir, name, gpu, extra, gpu_total_bytes() if gpu else None)
    temp = TempRoot(TEMP_PREFIX)
    for gone in temp.remove_orphans():
        print(f"cosy backend: removed {gone}, the temp dir of a backend that is gone", file=sys.stderr)
    env.update(temp_env(temp.claim(), gpu))
    try:
        return _serve(args, cmd, env, export_dir, name, gpu)
    finally:
        temp.remove()


def temp_env(root: Path, gpu: bool) -> dict[str, str]:
    """vLLM's temp files go into `root` (this backend's own, removed when it ends): in the temp dir, its
    rendezvous file (vllm_dist_*) and IPC sockets outlive even a clean stop. Inductor's compile cache stays
    where it was, since it is worth keeping across restarts (vLLM compiles on the GPU only)."""
    env = {"TMPDIR": str(root)}
    if gpu and "TORCHINDUCTOR_CACHE_DIR" not in os.environ:
        from torch._inductor.runtime.cache_dir_utils import default_cache_dir
        env["TORCHINDUCTOR_CACHE_DIR"] = default_cache_dir()  # under this process's temp dir
    return env


def _serve(args: argparse.Namespace, cmd: list[str], env: dict[str, str], export_dir: Path, name: str,
           gpu: bool) -> int:
    """Run vLLM until it ends; its exit status."""
    dtype, why = backend_dtype(args.dtype, gpu)
    print(f"cosy backend: serving {export_dir} as {name} on {'GPU' if gpu else 'CPU'} in {dtype} ({why})",
          file=sys.stderr)
    child = Child(cmd, env, args.nice)
    stopping = []

    def forward(sig: int, _frame) -> None:
        stopping.append(sig)
        child.signal(sig)

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, forward)
    url_host = _url_host(args.host)
    why = wait_ready(child, f"http://{url_host}:{args.port}", args.api_key, warmup_body(export_dir, name),
                     args.start_timeout)
    if why is not None:
        rc = child.stop() if child.proc.poll() is None else child.returncode()
        if stopping:  # asked to stop while starting: not an error of ours
            return rc
        print("\n".join(["", "---- last lines of vLLM's log ----", *child.tail, "----"]), file=sys.stderr)
        print(f"error: cosy backend failed to start: {why}", file=sys.stderr)
        return rc or 1
    print(f"cosy backend ready: http://{url_host}:{args.port}/v1", flush=True)
    return child.returncode()


if __name__ == "__main__":
    sys.exit(main())
