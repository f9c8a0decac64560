"""The frontend process: flags -> model dir, data dir, worker pool -> FastAPI app (WebUI + APIs) on uvicorn.

    python app.py --model_dir iic/CosyVoice2-0.5B --data_dir /nas/cosy --workers 2 --port 50000

The app is a FastAPI app with the Gradio Blocks (WebUI and gradio_client API) mounted at "/"; HTTP APIs
are added to it by `build_app(..., extensions=[...])` before the mount.
"""
from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")  # before gradio is imported: no calls home
from cosy.frontend import store  # noqa: E402
from cosy.frontend.gradio_stubs import skip_stub_pass  # noqa: E402

skip_stub_pass()  # before gradio is imported: it starts 1.4 CPU s sooner

# gradio's uploads and cache go into this process's temp dir (bounded, removed at exit), unless set by the user
OWN_GRADIO_TEMP = "GRADIO_TEMP_DIR" not in os.environ
os.environ.setdefault("GRADIO_TEMP_DIR", str(store.GRADIO_TEMP))

import uvicorn  # noqa: E402
from fastapi import FastAPI  # noqa: E402

from cosy.frontend.http_protocol import HeaderTimeoutProtocol  # noqa: E402
from cosy.frontend.options import (  # noqa: E402 -- app.py, the batch CLI and tests read them from here too
    default_device,
    flow_batch,
    max_batch,
    parse_args,
    speech_cache_mb,
    visible_gpus,
)
from cosy.frontend.service import FrontendService  # noqa: E402
from cosy.pipeline.request import PRIORITY_AGING  # noqa: E402
from cosy.service.placement import MpsDaemon, worker_devices  # noqa: E402
from cosy.service.workers import EngineSpec, WorkerPool  # noqa: E402


def say(msg: str) -> None:
    print(f"[cosy] {msg}", file=sys.stderr, flush=True)


def build_service(args: argparse.Namespace, env: dict[str, str] | None = None) -> FrontendService:
    """Resolve the model (downloading it once if it is a hub id), open the data dir, start the workers
    (`env`: set in each worker, e.g. the MPS daemon's pipe dir)."""
    from cosy.deploy.data_dir import DataDir
    from cosy.deploy.models import resolve_model_dir, resolve_ttsfrd_dir

    data = DataDir(args.data_dir, upload_bounds=store.Bounds.of(args.uploads_max_age, args.uploads_max_mb))
    if getattr(args, "max_voices", None) is not None:  # app.py's caps on the saved voices (cosy.deploy.voices)
        from cosy.deploy.voices import VoiceLimits
        data.voices.limits = VoiceLimits.of(args.max_voices, args.voices_max_mb)
    model_dir = resolve_model_dir(args.model_dir, data.models_root)
    ttsfrd = resolve_ttsfrd_dir(args.ttsfrd_dir, data.models_root)
    device = ",".join(worker_devices(args.device or default_device(), visible_gpus()))
    lm = f"LM backends {args.llm_base_url}" if args.llm_base_url else "embedded LM"
    from cosy.model.precision import describe
    dtype = describe(getattr(args, "dtype", "float32"), device.split(",")[0],
                     ("flow",) if args.llm_base_url else ("lm", "flow"))  # what `auto` chose, and why
    say(f"starting {args.workers} worker(s) on {device} ({dtype}): {model_dir}, {lm}")
    spec = EngineSpec(str(model_dir), device=device, dtype=getattr(args, "dtype", "float32"),
                      tf32=getattr(args, "tf32", True), compile=getattr(args, "compile", False),
                      ttsfrd_dir=str(ttsfrd) if ttsfrd else None,
                      llm_base_url=args.llm_base_url, llm_api_key=args.llm_api_key,
                      llm_stall_timeout=args.llm_stall_timeout,
                      llm_queue_timeout=args.llm_queue_timeout, max_batch=max_batch(args, device),
                      llm_split_first_chunk=args.llm_split_first_chunk,
                      flow_batch=flow_batch(args, device),
                      cache_mb=speech_cache_mb(args, device), fixed_tokens=args.fixed_tokens,
                      lm_batch=getattr(args, "lm_batch", 0),
                      llm_variant=getattr(args, "llm_variant", None), aligner=getattr(args, "aligner", None),
                      env=dict(env or {}))
    pool = WorkerPool(spec, workers=args.workers, max_queue=args.max_queue,
                      priorities=getattr(args, "priorities", "on") == "on",
                      aging=getattr(args, "priority_aging", PRIORITY_AGING)).start()
    service = FrontendService(pool, data)
    service.ws_idle_timeout = args.ws_idle_timeout
    service.allow_priority = frozenset(getattr(args, "allow_priority", ()))
    return service


def backend_max_model_len(base_url: str, api_key: str | None, model: str, timeout: float = 5.0) -> int | None:
    """The `max_model_len` a vLLM backend lists for `model` in `GET /v1/models`; None if it cannot say."""
    import httpx
    try:
        r = httpx.get(base_url.rstrip("/") + "/models", timeout=timeout,
                      headers={"Authorization": f"Bearer {api_key}"} if api_key else {})
        r.raise_for_status()
        for m in r.json().get("data", []):
            if m.get("id") == model and isinstance(m.get("max_model_len"), int):
                return m["max_model_len"]
    except (httpx.HTTPError, ValueError, AttributeError):
        pass
    return None


GRADIO_QUEUE_POLL = 0.01  # seconds


def build_app(service: FrontendService, workers: int, max_queue: int,
              extensions: Sequence[Callable[[FastAPI], object]] = ()) -> FastAPI:
    """FastAPI app: `extensions(app)` add their routes first, then the WebUI and gradio_client API are
    mounted at '/' (a mount matches every path below it, so routes must come before it)."""
    import gradio as gr

    from cosy.frontend import gradio_api, gradio_compat, webui

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
    # gradio's queue looks for new jobs every 1 ms when it has none: 2 % of a core for an idle frontend
    # here; every 10 ms it is 0.5 %, and a gradio call waits at most 10 ms more to start
    blocks._queue.sleep_when_free = GRADIO_QUEUE_POLL
    gr.mount_gradio_app(app, blocks, path="/", theme=webui.THEME, footer_links=["api", "gradio"],
                        max_file_size=service.data.max_upload_bytes)
    app.add_middleware(gradio_compat.PadRawCalls)
    # gradio checks that request files were uploaded (not server paths) only once it counts as launched,
    # which launch() sets and mounting does not
    blocks.has_launched = True
    return app


def readiness(service: FrontendService, llm_base_url: str | None,
              llm_api_key: str | None) -> Callable[[], tuple[bool, str]]:
    """/ready: the workers run and (with backends) at least one LM backend is usable: not marked dead in
    the table the workers' backend pools share (`WorkerPool.backend_health`), and answering with our
    llm.pt. A backend this check cannot reach is marked dead there too, so the pools skip it: /ready and
    the pools agree."""
    from cosy.lm.export import llm_fingerprint, served_model_name
    from cosy.lm.remote import BackendError, BackendUnavailable, RemoteLM

    urls = [u.strip() for u in (llm_base_url or "").split(",") if u.strip()]
    family = service.family
    name = served_model_name(llm_fingerprint(service.pool.spec.model_dir), family) if urls else ""
    # a backend busy with many streams answers /models late but is serving: 5 s before calling it stalled
    # (within the proxy's check timeout, cosy.deploy.haproxy); an unreachable one refuses at once
    backends = [RemoteLM(u, llm_api_key, name, connect_timeout=2.0, read_timeout=5.0, retries=0, family=family)
                for u in urls]
    health = getattr(service.pool, "backend_health", None)
    cooldown = 10.0  # BackendPool's

    lens: dict[str, int] = {}

    def learn_max_len(b: RemoteLM) -> None:
        """The LM's context: the smallest max_model_len of the backends seen (a request must fit any)."""
        if b.base_url not in lens:
            n = backend_max_model_len(b.base_url, llm_api_key, name)
            if n:
                lens[b.base_url] = n
                service.lm_max_len = min(lens.values())

    def ready() -> tuple[bool, str]:
        if getattr(service.pool, "draining", False):
            return False, "shutting down (draining the requests in flight)"
        if not service.pool.alive():
            return False, "synthesis workers are not running"
        errors = []
        for i, b in enumerate(backends):
            if health is not None and health[i] > time.monotonic():
                errors.append(f"{b.base_url} failed recently (stalled or unreachable)")
                continue
            try:
                b.check()
                learn_max_len(b)
                return True, "ready"
            except BackendError as e:
                if health is not None and isinstance(e, BackendUnavailable):
                    health[i] = time.monotonic() + cooldown
                errors.append(str(e))
        return (False, "; ".join(errors)) if errors else (True, "ready")

    for b in backends:  # at start-up: each reachable backend's max_model_len (later ones at /ready)
        learn_max_len(b)
        if b.base_url not in lens:  # it did not answer: say why (e.g. still starting: /ready answers 503)
            try:
                b.check()
            except BackendError as e:
                say(f"not ready yet: {e}")

    return ready


class _Server(uvicorn.Server):
    """uvicorn that announces readiness once the socket is listening, and drains before it stops: on the
    first SIGTERM/SIGINT the pool drains (`WorkerPool.drain`: /ready turns 503 so proxies and Kubernetes
    stop sending, streams in flight finish or end with a ShuttingDown error) in a thread, then uvicorn stops;
    a second signal stops at once."""

    drain: Callable[[], None] | None = None

    def handle_exit(self, sig: int, frame) -> None:
        drain, self.drain = self.drain, None
        if drain is None or self.should_exit:
            return super().handle_exit(sig, frame)

        def drain_then_exit() -> None:
            try:
                drain()
            finally:
                self.should_exit = True

        threading.Thread(target=drain_then_exit, name="drain", daemon=True).start()

    async def startup(self, sockets=None) -> None:
        await super().startup(sockets)
        if self.started:
            c = self.config
            print(f"cosy frontend ready: http://{c.host}:{c.port}/", flush=True)


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    if args.cpus is not None:
        from cosy.deploy.cpus import pin
        try:
            say(f"running on CPUs {args.cpus} ({len(pin(args.cpus))} cores)")  # workers inherit it
        except ValueError as e:
            print(f"error: {e}", file=sys.stderr, flush=True)
            raise SystemExit(2) from None
    store.claim_temp_root()
    for gone in store.remove_orphaned_temp_roots():
        say(f"removed {gone}, the temp dir of a frontend that is gone")
    mps = MpsDaemon(store.TEMP_ROOT / "mps") if args.enable_mps else None
    from cosy.frontend import gradio_api
    gradio_api.RESULT_BOUNDS = store.Bounds.of(args.results_max_age, args.results_max_mb)
    service = None
    try:
        try:
            # the daemon before any worker touches CUDA; only the workers get its pipe dir
            env = mps.env if mps is not None and mps.start() else {}
            service = build_service(args, env)
        except (RuntimeError, ValueError, OSError) as e:  # ModelDirError is a ValueError
            print(f"error: {e}", file=sys.stderr, flush=True)
            raise SystemExit(2) from None
        stores = [(service.data.uploads, service.data.upload_bounds), (store.RESULTS, gradio_api.RESULT_BOUNDS)]
        if OWN_GRADIO_TEMP:
            stores.append((store.GRADIO_TEMP, gradio_api.RESULT_BOUNDS))
        pruner = store.Pruner(stores)  # started once the page is built (`store.pin`)
        from cosy.frontend import http_api
        from cosy.frontend.ws_tasks import MAX_MESSAGE_BYTES
        ready = readiness(service, args.llm_base_url, args.llm_api_key)
        say(f"the LM takes {service.lm_max_len or 'an unknown number of'} tokens per request (text and "
            "transcript lengths are checked against it)")
        # the gradio queue must let every request a worker can hold through at once
        app = build_app(service, args.workers * service.pool.max_batch, args.max_queue,
                        extensions=[lambda app: http_api.install(app, service, api_key=args.api_key, ready=ready)])
        store.pin(Path(os.environ["GRADIO_TEMP_DIR"]))  # the examples' cached files, made while the page was built
        pruner.start()
        # uvicorn handles SIGINT/SIGTERM: stop accepting, end open requests (5 s), then return here and
        # re-raise the signal to the handler that was there before: for SIGTERM, ours (no-op), so that the
        # clean-up below runs instead of the default action killing the process
        signal.signal(signal.SIGTERM, lambda *_: None)
        # X-Forwarded-For only from --trusted_proxies (cosy.frontend.proxies), not uvicorn's 127.0.0.1 default
        from cosy.frontend.proxies import ForwardedFor
        app = ForwardedFor(app, trusted=args.trusted_proxies)
        # ws_max_size: a WebSocket message past what the task protocols need is refused (close 1009) as it
        # arrives, not read into memory and parsed (uvicorn's default is 16 MiB)
        server = _Server(uvicorn.Config(app, proxy_headers=False, host=args.host, port=args.port, log_level="warning",
                                        timeout_graceful_shutdown=5, ws_max_size=MAX_MESSAGE_BYTES,
                                        http=HeaderTimeoutProtocol.with_timeout(args.header_timeout)))

        def drain() -> None:
            say(f"stopping: draining requests in flight (up to {args.drain_timeout:g} s)")
            cut = service.pool.drain(args.drain_timeout)
            if cut:
                say(f"{cut} request(s) still running were ended with ShuttingDown")
                time.sleep(1.0)  # their error events go out before the connections close

        server.drain = drain
        server.run()
        pruner.stop()
    except KeyboardInterrupt:  # a second Ctrl-C, or one during start-up
        pass
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # the clean-up below is not to be interrupted
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        if service is not None:
            service.pool.close()
        if mps is not None:
            mps.stop()  # after the workers (its clients) are gone
        store.remove_temp_root()
        say("stopped")
