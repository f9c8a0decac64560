"""The frontend process: flags -> model dir, data dir, worker pool -> FastAPI app (WebUI + APIs) on uvicorn.

    python app.py --model_dir iic/CosyVoice2-0.5B --data_dir /nas/cosy --workers 2 --port 50000

The app is a FastAPI app with the Gradio Blocks (WebUI and gradio_client API) mounted at "/"; HTTP APIs
are added to it by `build_app(..., extensions=[...])` before the mount.
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Sequence

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")  # before gradio is imported: no calls home

import uvicorn  # noqa: E402
from fastapi import FastAPI  # noqa: E402

from cosy.frontend.service import FrontendService  # noqa: E402
from cosy.service.workers import EngineSpec, WorkerPool  # noqa: E402


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    from cosy.deploy.models import DEFAULT_MODEL
    p = argparse.ArgumentParser(prog="app.py", description="cosy frontend: CosyVoice2 WebUI and APIs")
    p.add_argument("--model_dir", default=DEFAULT_MODEL,
                   help=f"model directory (local or NAS path) or ModelScope id, downloaded into DATA_DIR/models "
                        f"on first use (default {DEFAULT_MODEL})")
    p.add_argument("--ttsfrd_dir", default=None,
                   help="CosyVoice-ttsfrd directory or hub id for text normalization (default: wetext)")
    p.add_argument("--data_dir", default="data",
                   help="uploads, saved voices and downloaded models; share it between frontends (default data)")
    p.add_argument("--llm_base_url", default=None,
                   help="comma-separated LM backends (http://host:port/v1); absent: an embedded LM per worker")
    p.add_argument("--llm_api_key", default=os.environ.get("COSY_LLM_API_KEY"),
                   help="API key of the LM backends (default: $COSY_LLM_API_KEY)")
    p.add_argument("--host", default="0.0.0.0", help="address to listen on (default 0.0.0.0)")
    p.add_argument("--port", type=int, default=50000, help="port to listen on (default 50000)")
    p.add_argument("--workers", type=int, default=1, help="synthesis worker processes (default 1)")
    p.add_argument("--max_batch", type=int, default=None,
                   help="live requests each worker serves at once, their LM streams concurrent and their flow/"
                        "HiFT work scheduled (default 8 on cpu, 16 on cuda; 1 = the old one-at-a-time loop)")
    p.add_argument("--speech_cache_mb", type=int, default=None,
                   help="MiB of streaming flow state per worker, so chunks compute only new frames and saved "
                        "voices reuse their prompt (about 220 MiB per second held; default 2048 on cpu, "
                        "8192 on cuda; 0 = recompute)")
    p.add_argument("--enable_mps", action="store_true",
                   help="start or join the CUDA MPS daemon so the workers share the GPU")
    p.add_argument("--api_key", default=os.environ.get("COSY_API_KEY"),
                   help="bearer token the HTTP APIs require (default: $COSY_API_KEY; unset = open)")
    p.add_argument("--max_queue", type=int, default=64,
                   help="waiting requests before new ones are refused as busy (default 64)")
    p.add_argument("--device", choices=("cpu", "cuda"), default=None,
                   help="where the workers run the models (default cuda if available, else cpu)")
    args = p.parse_args(argv)
    if args.workers < 1 or args.max_queue < 0 or (args.max_batch is not None and args.max_batch < 1):
        p.error("--workers and --max_batch must be >= 1 and --max_queue >= 0")
    return args


def say(msg: str) -> None:
    print(f"[cosy] {msg}", file=sys.stderr, flush=True)


def enable_mps() -> None:
    """Start the CUDA MPS control daemon unless it runs already; without an NVIDIA GPU, say so and go on."""
    def run(*cmd: str, stdin: str | None = None) -> subprocess.CompletedProcess | None:
        try:
            return subprocess.run(cmd, input=stdin, capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            return None

    smi = run("nvidia-smi", "-L") if shutil.which("nvidia-smi") else None
    if smi is None or smi.returncode != 0 or "GPU" not in smi.stdout:
        print("--enable_mps: no NVIDIA GPU here; ignored", flush=True)
        return
    if not shutil.which("nvidia-cuda-mps-control"):
        print("--enable_mps: nvidia-cuda-mps-control not found (install the CUDA MPS tools); ignored", flush=True)
        return
    query = run("nvidia-cuda-mps-control", stdin="get_server_list\n")  # succeeds only with a daemon up
    if query is not None and query.returncode == 0:
        say("CUDA MPS daemon already running; the workers join it")
        return
    started = run("nvidia-cuda-mps-control", "-d")
    if started is None or started.returncode != 0:
        why = (started.stderr or started.stdout).strip() if started else "did not run"
        print(f"--enable_mps: could not start the MPS daemon ({why}); continuing without it", flush=True)
    else:
        say("started the CUDA MPS daemon (stop it with: echo quit | nvidia-cuda-mps-control)")


def default_device() -> str:
    import torch
    return "cuda" if torch.cuda.is_available() else "cpu"


def max_batch(args: argparse.Namespace, device: str) -> int:
    mb = getattr(args, "max_batch", None)
    return mb if mb is not None else (16 if device == "cuda" else 8)


def speech_cache_mb(args: argparse.Namespace, device: str) -> int:
    mb = getattr(args, "speech_cache_mb", None)
    return mb if mb is not None else (8192 if device == "cuda" else 2048)


def build_service(args: argparse.Namespace) -> FrontendService:
    """Resolve the model (downloading it once if it is a hub id), open the data dir, start the workers."""
    from cosy.deploy.data_dir import DataDir
    from cosy.deploy.models import resolve_model_dir, resolve_ttsfrd_dir

    data = DataDir(args.data_dir)
    model_dir = resolve_model_dir(args.model_dir, data.models_root)
    ttsfrd = resolve_ttsfrd_dir(args.ttsfrd_dir, data.models_root)
    device = args.device or default_device()
    lm = f"LM backends {args.llm_base_url}" if args.llm_base_url else "embedded LM"
    say(f"starting {args.workers} worker(s) on {device}: {model_dir}, {lm}")
    spec = EngineSpec(str(model_dir), device=device, ttsfrd_dir=str(ttsfrd) if ttsfrd else None,
                      llm_base_url=args.llm_base_url, llm_api_key=args.llm_api_key,
                      max_batch=max_batch(args, device), cache_mb=speech_cache_mb(args, device))
    pool = WorkerPool(spec, workers=args.workers, max_queue=args.max_queue).start()
    return FrontendService(pool, data)


def build_app(service: FrontendService, workers: int, max_queue: int,
              extensions: Sequence[Callable[[FastAPI], object]] = ()) -> FastAPI:
    """FastAPI app: `extensions(app)` add their routes first, then the WebUI and gradio_client API are
    mounted at '/' (a mount matches every path below it, so routes must come before it)."""
    import gradio as gr

    from cosy.frontend import gradio_api, webui

    app = FastAPI(title="cosy", docs_url=None, redoc_url=None)  # "/" and below belong to gradio
    for extend in extensions:
        extend(app)
    blocks = webui.build(service)
    with blocks:
        gradio_api.register(service)
    # every request goes straight to the worker pool, which queues fairly and refuses past max_queue;
    # waiting requests each hold a gradio job slot and a thread (queue() sizes both from max_threads)
    blocks.max_threads = max(40, workers + max_queue + 8)
    blocks.queue(default_concurrency_limit=None, max_size=None)
    gr.mount_gradio_app(app, blocks, path="/", theme=webui.THEME, footer_links=["api", "gradio"],
                        max_file_size=service.data.max_upload_bytes)
    # gradio checks that request files were uploaded (not server paths) only once it counts as launched,
    # which launch() sets and mounting does not
    blocks.has_launched = True
    return app


def readiness(service: FrontendService, llm_base_url: str | None,
              llm_api_key: str | None) -> Callable[[], tuple[bool, str]]:
    """/ready: the workers run and (with backends) at least one LM backend answers with our llm.pt."""
    from cosy.lm.export import llm_fingerprint, served_model_name
    from cosy.lm.remote import BackendError, RemoteLM

    urls = [u.strip() for u in (llm_base_url or "").split(",") if u.strip()]
    family = service.family
    name = served_model_name(llm_fingerprint(service.pool.spec.model_dir), family) if urls else ""
    backends = [RemoteLM(u, llm_api_key, name, connect_timeout=2.0, read_timeout=5.0, retries=0, family=family)
                for u in urls]

    def ready() -> tuple[bool, str]:
        if not service.pool.alive():
            return False, "synthesis workers are not running"
        errors = []
        for b in backends:
            try:
                b.check()
                return True, "ready"
            except BackendError as e:
                errors.append(str(e))
        return (False, "; ".join(errors)) if errors else (True, "ready")

    return ready


class _Server(uvicorn.Server):
    """uvicorn that announces readiness once the socket is listening."""

    async def startup(self, sockets=None) -> None:
        await super().startup(sockets)
        if self.started:
            c = self.config
            print(f"cosy frontend ready: http://{c.host}:{c.port}/", flush=True)


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    if args.enable_mps:
        enable_mps()  # before any worker touches CUDA
    try:
        service = build_service(args)
    except (RuntimeError, ValueError, OSError) as e:  # ModelDirError is a ValueError
        print(f"error: {e}", file=sys.stderr, flush=True)
        raise SystemExit(2) from None
    try:
        from cosy.frontend import http_api
        ready = readiness(service, args.llm_base_url, args.llm_api_key)
        # the gradio queue must let every request a worker can hold through at once
        app = build_app(service, args.workers * service.pool.max_batch, args.max_queue,
                        extensions=[lambda app: http_api.install(app, service, api_key=args.api_key, ready=ready)])
        _Server(uvicorn.Config(app, host=args.host, port=args.port, log_level="warning",
                               timeout_graceful_shutdown=5)).run()
    finally:
        service.pool.close()
