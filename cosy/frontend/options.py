"""The frontend's flags (`python app.py --help`, `python -m cosy batch`) and the defaults that depend on the
device: what a frontend is asked to be, checked, before anything is built (`cosy.frontend.server`)."""
from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from cosy.frontend import store
from cosy.model.precision import DTYPE_CHOICES, resolve_dtype
from cosy.service.placement import worker_devices


def build_parser() -> argparse.ArgumentParser:
    """app.py's flags (the docs' flags reference is generated from this parser)."""
    from cosy.deploy.models import DEFAULT_MODEL
    from cosy.deploy.voices import DEFAULT_LIMITS
    p = argparse.ArgumentParser(prog="app.py", description="cosy frontend: the CosyVoice2 / CosyVoice3 WebUI and APIs")
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
    p.add_argument("--llm_variant", default=None,
                   help="LM checkpoint: default (llm.pt) or rl (CosyVoice3: llm.rl.pt, RL-tuned); LM backends "
                        "must serve the same (launch/backend.py --llm_variant)")
    p.add_argument("--llm_api_key_file", default=None,
                   help="read the LM backends' key from this file (trailing newline stripped; keeps it out of ps)")
    p.add_argument("--host", default="0.0.0.0", help="address to listen on (default 0.0.0.0)")
    p.add_argument("--port", type=int, default=50000, help="port to listen on (default 50000)")
    p.add_argument("--workers", type=int, default=1, help="synthesis worker processes (default 1)")
    p.add_argument("--max_batch", type=int, default=None,
                   help="live requests each worker serves at once, their LM streams concurrent and their flow/"
                        "HiFT work scheduled (default 8 on cpu, 16 on cuda; 1 = the old one-at-a-time loop)")
    p.add_argument("--flow_batch", type=int, default=None,
                   help="most requests of a worker whose whole-utterance (or final streaming chunk) flow runs "
                        "as one padded batch (default 1 on cpu, where a batch row costs as much as a solo run; "
                        "8 on cuda)")
    p.add_argument("--lm_batch", type=int, default=0,
                   help="embedded LM only: decode up to N of a worker's live requests as one batch per step "
                        "(needs --max_batch > 1; a row's logits then equal its solo ones within float rounding, "
                        "so the same seed may draw other tokens under load; default 0: each request decodes "
                        "alone)")
    p.add_argument("--speech_cache_mb", type=int, default=None,
                   help="MiB of streaming flow state per worker, so chunks compute only new frames and saved "
                        "voices reuse their prompt (about 220 MiB per second held; default 2048 on cpu, "
                        "8192 on cuda; 0 = recompute)")
    p.add_argument("--fixed_tokens", type=int, default=0,
                   help="benchmarks only: every request generates exactly N speech tokens (stop tokens "
                        "masked), so random weights cannot skew lengths (default 0: off)")
    p.add_argument("--cpus", default=None,
                   help="CPU list the app and its workers run on, e.g. 1-3 (default: every CPU allowed); on one "
                        "machine with the LM backend give each its own cores (see README 'One machine')")
    p.add_argument("--enable_mps", action="store_true",
                   help="run the workers under a CUDA MPS daemon of this app's own (started with it, stopped "
                        "at exit; other CUDA processes such as the LM backend stay outside it)")
    p.add_argument("--api_key", default=os.environ.get("COSY_API_KEY"),
                   help="the key every route but /health and /ready requires: HTTP APIs, gradio API, WebUI "
                        "(default: $COSY_API_KEY; unset = open)")
    p.add_argument("--api_key_file", default=None,
                   help="read --api_key from this file (trailing newline stripped; keeps it out of ps)")
    p.add_argument("--trusted_proxies", default="",
                   help="comma-separated addresses and CIDR networks of the proxies in front of this frontend "
                        "(e.g. HAProxy's address): only on their connections does X-Forwarded-For name the client "
                        "(the rightmost address that is no trusted proxy), so the wrong-key limit is per client "
                        "(default: none; every client is the address it connects from)")
    p.add_argument("--max_queue", type=int, default=64,
                   help="waiting requests of a priority class and the more urgent ones before new ones of that "
                        "class are refused as busy (default 64)")
    p.add_argument("--priorities", choices=("on", "off"), default="on",
                   help="serve by priority class (interactive, default, bulk; streams are interactive, whole "
                        "files default, batch bulk): the worker queue by class then arrival, the workers' flow "
                        "work and the LM backend's queue likewise, and each worker's last slot kept for "
                        "interactive requests; off: one first-come queue (default on)")
    from cosy.pipeline.request import PRIORITY_AGING
    p.add_argument("--priority_aging", type=float, default=PRIORITY_AGING,
                   help="seconds a waiting request (in the worker queue, and its flow work in a worker) takes to "
                        f"move up one priority class, so bulk work is never starved (default {PRIORITY_AGING:g})")
    p.add_argument("--allow_priority", default="",
                   help="comma-separated classes a client may ask for above its request's default (e.g. "
                        "interactive: a whole-file API call may ask to be served as a stream is); a less urgent "
                        "class is always allowed (default: none)")
    p.add_argument("--device", default=None,
                   help="where the workers run the models: cpu, cuda (every visible GPU, workers round-robin), "
                        "cuda:N, or a list cuda:0,cuda:1 (default cuda if available, else cpu)")
    p.add_argument("--aligner", default=None, metavar="MODEL_DIR",
                   help="a CTC forced aligner in the Hugging Face format (the MMS aligner of the ctc-forced-aligner "
                        "package, mms-300m-1130-forced-aligner; see docs/api/timestamps.md): each worker loads it "
                        "on its device at start-up and times the words of each sentence of the requests that ask "
                        "(word_timestamp_enabled); a directory that does not load stops the start with the reason "
                        "(default: none; asking for word timings is then a 400)")
    p.add_argument("--dtype", choices=DTYPE_CHOICES, default="float32",
                   help="the LM's and flow estimator's dtype; the ODE, the flow encoder and HiFT stay float32 "
                        "(default float32; float16 needs CUDA; auto: bfloat16 for each where the CPU or GPU has "
                        "bfloat16 units, float32 elsewhere, logged at start-up; see README 'Precision')")
    p.add_argument("--compile", action="store_true",
                   help="torch.compile the flow estimator and the embedded LM's stack (compiled at start-up; "
                        "fused kernels, mainly for GPUs; see README 'Precision')")
    p.add_argument("--no_tf32", dest="tf32", action="store_false",
                   help="strict float32 on CUDA (default: TF32 matmuls and convolutions; see README 'Precision')")
    from cosy.lm.watchdog import DEFAULT_QUEUE_TIMEOUT, DEFAULT_STALL_TIMEOUT
    p.add_argument("--llm_stall_timeout", type=float, default=DEFAULT_STALL_TIMEOUT,
                   help="seconds an LM backend may go without sending a token before the request moves to "
                        f"another backend (nothing generated yet) or fails (default {DEFAULT_STALL_TIMEOUT:g})")
    p.add_argument("--llm_queue_timeout", type=float, default=DEFAULT_QUEUE_TIMEOUT,
                   help="seconds an LM backend may keep a request waiting for its first token while it sends "
                        "only queue keep-alives (queued is not stalled, but not forever) before the request "
                        f"moves to another backend or fails (default {DEFAULT_QUEUE_TIMEOUT:g})")
    from cosy.lm.first_chunk import SETTINGS
    p.add_argument("--llm_split_first_chunk", choices=SETTINGS, default="auto",
                   help="ask the LM backend for a streamed utterance's first chunk of tokens as a request of its "
                        "own and for the rest once that chunk is out, so that the backend's decode does not slow "
                        "the first chunk's flow on a machine both share (on, off; default auto: on when every "
                        "--llm_base_url host is this machine's loopback; see README 'One machine')")
    from cosy.frontend.http_protocol import HEADER_TIMEOUT
    p.add_argument("--header_timeout", type=float, default=HEADER_TIMEOUT,
                   help="seconds a connection has to send a request line and its headers; slower ones are "
                        f"closed (slowloris; default {HEADER_TIMEOUT:g}, HAProxy's `timeout http-request`)")
    p.add_argument("--drain_timeout", type=float, default=30.0,
                   help="on SIGTERM: /ready answers 503 at once and requests in flight get this many seconds to "
                        "finish; those still running then end with a ShuttingDown error (event) (default 30; keep "
                        "the orchestrator's grace period above it)")
    up, res = store.DEFAULT_UPLOADS, store.DEFAULT_RESULTS
    p.add_argument("--ws_idle_timeout", type=float, default=60.0,
                   help="seconds a WebSocket task (or a connection without one) may go without a client message "
                        "or audio sent before it fails with IdleTimeout and the connection closes (default 60)")
    p.add_argument("--uploads_max_age", type=float, default=up.max_age,
                   help=f"seconds an accepted upload is kept in DATA_DIR/uploads (default {up.max_age:g})")
    p.add_argument("--uploads_max_mb", type=float, default=up.max_bytes / 2**20,
                   help=f"total size of DATA_DIR/uploads, oldest pruned first (default {up.max_bytes >> 20})")
    p.add_argument("--max_voices", type=int, default=DEFAULT_LIMITS.max_voices,
                   help="saved voices a data dir may hold; a new one past it is refused with 409 (0: no cap; "
                        f"default {DEFAULT_LIMITS.max_voices})")
    p.add_argument("--voices_max_mb", type=float, default=DEFAULT_LIMITS.max_bytes / 2**20,
                   help="total size of the saved voices in DATA_DIR/voices; a new one past it is refused with 409 "
                        f"(0: no cap; default {DEFAULT_LIMITS.max_bytes >> 20})")
    p.add_argument("--results_max_age", type=float, default=res.max_age,
                   help=f"seconds a result file (and gradio's temp files) are kept (default {res.max_age:g})")
    p.add_argument("--results_max_mb", type=float, default=res.max_bytes / 2**20,
                   help="total size of the result files and of gradio's temp files each "
                        f"(default {res.max_bytes >> 20})")
    return p


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """app.py's flags, checked; exits with a usage error naming the problem."""
    p = build_parser()
    args = p.parse_args(argv)
    try:
        args.device = ",".join(worker_devices(args.device or default_device(), visible_gpus()))
        for d in set(args.device.split(",")):
            resolve_dtype(args.dtype, d)
    except ValueError as e:
        p.error(str(e))
    if args.workers < 1 or args.max_queue < 0 or any(v is not None and v < 1
                                                     for v in (args.max_batch, args.flow_batch)):
        p.error("--workers, --max_batch and --flow_batch must be >= 1 and --max_queue >= 0")
    if args.lm_batch < 0:
        p.error("--lm_batch must be >= 0")
    if args.fixed_tokens < 0:
        p.error("--fixed_tokens must be >= 0")
    if args.cpus is not None:
        from cosy.deploy.cpus import parse_cpus
        try:
            parse_cpus(args.cpus)
        except ValueError as e:
            p.error(f"--cpus: {e}")
    from cosy.deploy.keyfile import KeyFileError, read_key_file
    for flag, dest in (("--api_key_file", "api_key"), ("--llm_api_key_file", "llm_api_key")):
        path = getattr(args, dest + "_file")
        if path is not None:
            if getattr(args, dest) and f"--{dest}" in (argv or sys.argv):
                p.error(f"give --{dest} or {flag}, not both")
            try:
                setattr(args, dest, read_key_file(path, flag))
            except KeyFileError as e:
                p.error(str(e))
    from cosy.frontend.proxies import parse_trusted_proxies
    try:
        args.trusted_proxies = parse_trusted_proxies(args.trusted_proxies)
    except ValueError as e:
        p.error(str(e))
    if args.max_voices < 0 or args.voices_max_mb < 0:
        p.error("--max_voices and --voices_max_mb must be >= 0 (0: no cap)")
    if args.aligner is not None:  # what the workers would fail on, said before any of them starts
        from cosy.align.aligner import AlignerLoadError, check_model_dir
        try:
            check_model_dir(args.aligner)
        except AlignerLoadError as e:
            p.error(f"--aligner {args.aligner}: {e}")
    if args.drain_timeout < 0:
        p.error("--drain_timeout must be >= 0")
    if args.priority_aging <= 0:
        p.error("--priority_aging must be > 0 (seconds)")
    from cosy.frontend.service import parse_priorities
    try:
        args.allow_priority = parse_priorities(args.allow_priority)
    except ValueError as e:
        p.error(str(e))
    if min(args.llm_stall_timeout, args.llm_queue_timeout, args.header_timeout, args.uploads_max_age,
           args.uploads_max_mb, args.results_max_age, args.results_max_mb) <= 0:
        p.error("--llm_stall_timeout, --llm_queue_timeout, --header_timeout, --uploads_max_* and --results_max_* "
                "must be > 0")
    return args


def default_device() -> str:
    import torch
    return "cuda" if torch.cuda.is_available() else "cpu"


def visible_gpus() -> int:
    import torch
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def max_batch(args: argparse.Namespace, device: str) -> int:
    mb = getattr(args, "max_batch", None)
    return mb if mb is not None else (16 if device.startswith("cuda") else 8)


def flow_batch(args: argparse.Namespace, device: str) -> int:
    fb = getattr(args, "flow_batch", None)
    return fb if fb is not None else (8 if device.startswith("cuda") else 1)


def speech_cache_mb(args: argparse.Namespace, device: str) -> int:
    mb = getattr(args, "speech_cache_mb", None)
    return mb if mb is not None else (8192 if device.startswith("cuda") else 2048)
