"""Benchmark the deployment as it runs: one vLLM backend and N frontends (app.py), driven over the HTTP APIs.

    python bench/deployment.py [--size full|tiny | --model_dir DIR] [--frontends 1] [--workers 1] [--max_batch 8]
        [--concurrency 1,4,8] [--requests 0] [--modes zero_shot,cross_lingual,instruct,voice] [--apis pai,openai]
        [--tokens 100] [--capacity] [--split_cost] [--baseline_root DIR] [--json OUT] [--device cpu]
        [--llm_stall_timeout 120]
        [--backend_url URL] [--frontend_urls URL,URL] [--api_key KEY] [--llm_api_key KEY]
        [--backend_cpus LIST] [--frontend_cpus LIST] [--backend_nice N] [--backend_idle]
        [--dtype DT | --dtypes float32,bfloat16]

Starts the backend (launch/backend.py) and the frontends (app.py with `--fixed_tokens`, so every request
generates exactly --tokens speech tokens whatever the random weights prefer) on one shared data dir, unless
URLs are given (then start the frontends with `--fixed_tokens` yourself). --requests 0 = 2 x concurrency.
Prints, per concurrency and mode: requests, success rate, first packet p50/p95/p99, RTF p50/p95, aggregate
audio-seconds per wall-second; per concurrency the backend's /metrics (most running/waiting requests seen,
generation tokens/s).
--capacity: (a) the backend's saturated speech-token throughput (LM requests only, 32 at once), (b) one
  frontend's token consumption at its own saturation (workers x max_batch x 2 requests in flight, LM remote),
  frontends per backend = a / b; then the run above with --frontends confirms it (tokens/s of all frontends).
--split_cost: the same requests one at a time through the backend and with the embedded LM (a second frontend
  without --llm_base_url, on every CPU), alternating between the two (max(6, --requests) pairs): first-packet and
  total latency of each pair, the medians and their difference.
--baseline_root DIR: the same requests one at a time through this tree's deployment and through a second one
  (backend and frontend, same flags) run from the code in DIR (e.g. `git worktree add /tmp/base main`, the
  commit to compare with), alternating (max(6, --requests) pairs): first packet and total of each pair, the
  medians and their ratio. Both run on this environment's packages.
--dtype DT: both roles' --dtype (launch/backend.py's and app.py's; default: theirs, float32 on the CPU).
--dtypes A,B: the deployment in A, and a second one (backend and frontend) in B; each level runs on both, in
  turn (the order flips every level), and the B/A ratios of first packet p50, RTF p50 and audio-s per wall-s
  are printed (JSON: "dtypes").
--backend_cpus / --frontend_cpus: the CPU budgets (`--cpus` of launch/backend.py and app.py) of a one-machine
  split. --backend_nice N: the backend's `--nice N`; --backend_idle: under `chrt --idle 0` (SCHED_IDLE: it
  runs only on CPU time the frontends leave).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import load  # noqa: E402

READY = "cosy frontend ready: "
TOKEN_RATE = 25  # speech tokens per second of audio


def start_frontend(model_dir: Path, data_dir: Path, port: int, args, llm_url: str | None,
                   cpus: str | None = None, env: dict[str, str] | None = None, root: Path = ROOT) -> tuple:
    """`app.py` of the checkout `root` (`env`: variables added to ours); returns it and its URL once ready."""
    cmd = [sys.executable, str(root / "app.py"), "--model_dir", str(model_dir), "--data_dir", str(data_dir),
           "--host", "127.0.0.1", "--port", str(port), "--workers", str(args.workers), "--max_batch",
           str(args.max_batch), "--fixed_tokens", str(args.tokens), "--device", args.device, "--max_queue", "256",
           "--llm_stall_timeout", str(args.llm_stall_timeout)]
    if llm_url:
        cmd += ["--llm_base_url", llm_url, "--llm_api_key", args.llm_api_key]
    if cpus:
        cmd += ["--cpus", cpus]
    if getattr(args, "dtype", None):
        cmd += ["--dtype", args.dtype]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=root,
                            start_new_session=True, env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})})
    tail: list[str] = []
    for line in proc.stdout:
        tail = (tail + [line])[-30:]
        if line.startswith(READY):
            threading.Thread(target=lambda: [None for _ in proc.stdout], daemon=True).start()
            return proc, line[len(READY):].strip()
    raise SystemExit("frontend did not start:\n" + "".join(tail))


def stop(proc: subprocess.Popen) -> None:
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)


class BackendMetrics:
    """Polls the backend's Prometheus /metrics: most running/waiting requests seen, generation tokens/s."""

    NAMES = ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:generation_tokens_total")

    def __init__(self, llm_url: str | None, key: str):
        self.url = llm_url and llm_url.rstrip("/").removesuffix("/v1") + "/metrics"
        self.headers = {"Authorization": f"Bearer {key}"}

    def read(self) -> dict[str, float]:
        text = httpx.get(self.url, headers=self.headers, timeout=10).text
        out = dict.fromkeys(self.NAMES, 0.0)
        for name in self.NAMES:
            for m in re.finditer(rf"^{re.escape(name)}(?:{{[^}}]*}})? ([0-9.e+-]+)$", text, re.M):
                out[name] += float(m.group(1))
        return out

    def during(self, fn):
        """Run fn() while polling; (fn's result, {running_max, waiting_max, tokens_per_s, metrics_unanswered})
        or no figures."""
        if not self.url:
            return fn(), {}
        seen, done, missed = [], threading.Event(), [0]

        def poll():
            while not done.wait(0.5):
                try:
                    seen.append(self.read())
                except httpx.HTTPError:  # a starved backend answers late: counted, the level goes on
                    missed[0] += 1
        first, t0 = self.read(), time.perf_counter()
        threading.Thread(target=poll, daemon=True).start()
        try:
            result = fn()
        finally:
            done.set()
        last, wall = self.read(), time.perf_counter() - t0
        tokens = last["vllm:generation_tokens_total"] - first["vllm:generation_tokens_total"]
        return result, {"running_max": max((s[self.NAMES[0]] for s in seen), default=0),
                        "waiting_max": max((s[self.NAMES[1]] for s in seen), default=0),
                        "tokens_per_s": tokens / wall, "metrics_unanswered": missed[0]}


def backend_saturation(model_dir: Path, llm_url: str, key: str, tokens: int, concurrency: int = 32) -> float:
    """Speech tokens/s of the backend alone with `concurrency` LM requests at once."""
    from lm_throughput import measure, prompt

    from cosy.lm.export import llm_fingerprint, served_model_name
    from cosy.lm.prompt import PromptEmbedder
    from cosy.lm.remote import RemoteLM
    from cosy.model.files import ModelDir

    family = ModelDir(model_dir).family
    remote = RemoteLM(llm_url, key, served_model_name(llm_fingerprint(model_dir), family), family=family)
    embeds = prompt(PromptEmbedder.from_model_dir(model_dir))
    measure(remote, embeds, 5, 1)
    return measure(remote, embeds, tokens, concurrency)[0]


def row(label: str, s: dict) -> str:
    return (f"{label:<24} {s['requests']:>4} {100 * s['success']:>6.1f}% {s['first_p50']:>7.2f}s "
            f"{s['first_p95']:>7.2f}s {s['first_p99']:>7.2f}s {s['rtf_p50']:>6.2f} {s['rtf_p95']:>6.2f} "
            f"{s['audio_per_wall']:>8.3f}")


HEADER = (f"{'level / mode':<24} {'reqs':>4} {'success':>7} {'fp p50':>8} {'fp p95':>8} {'fp p99':>8} "
          f"{'RTF50':>6} {'RTF95':>6} {'audio/s':>8}")


def drive(targets, args, metrics: BackendMetrics, levels: list[int], report: dict) -> None:
    modes, apis = args.modes.split(","), args.apis.split(",")
    print(HEADER)
    for n in levels:
        (results, wall), backend = metrics.during(
            lambda: load.run_level(targets, modes, apis, n, args.requests or 2 * n))
        overall = load.summarize(results, wall)
        report["levels"].append({"concurrency": n, "all": overall, "backend": backend, "modes": {
            m: load.summarize([r for r in results if r.mode == m], wall) for m in modes}})
        print(row(f"x{n} all", overall) + ("  errors: " + "; ".join(overall["errors"]) if overall["errors"] else ""))
        for m in modes:
            if report["levels"][-1]["modes"][m]["requests"]:  # (few requests may leave a mode out)
                print(row(f"x{n}   {m}", report["levels"][-1]["modes"][m]))
        if backend:
            print(f"x{n} backend: running max {backend['running_max']:.0f}, waiting max "
                  f"{backend['waiting_max']:.0f}, {backend['tokens_per_s']:.1f} tokens/s"
                  + (f"; /metrics unanswered {backend['metrics_unanswered']} times (10 s timeout)"
                     if backend["metrics_unanswered"] else ""), flush=True)


def paired(label: str, a: tuple[str, load.Target], b: tuple[str, load.Target], pairs: int) -> dict:
    """One request at a time, alternating two deployments `a` and `b` ((name, target) each; ABBA: each pair's
    order flips), so a machine that drifts or a process still settling after its start weighs on both alike;
    the same seed in each pair. Prints every pair and the medians; returns both summaries and a vs b in %."""
    (na, _), (nb, _) = a, b
    runs: dict[str, list] = {na: [], nb: []}
    print(f"{label}: {pairs} pairs of requests one at a time (saved voice, PAI), alternating", flush=True)
    for i in range(pairs):
        for name, target in (a, b) if i % 2 == 0 else (b, a):
            runs[name].append(load.one(target, "voice", "pai", seed=i))
        ra, rb = runs[na][-1], runs[nb][-1]
        print(f"  pair {i}: first packet {ra.first:6.2f}s {na}, {rb.first:6.2f}s {nb}; total {ra.total:6.2f}s, "
              f"{rb.total:6.2f}s", flush=True)
    # one at a time: each side's wall time is the sum of its requests' times
    sa, sb = (load.summarize(runs[n], sum(r.total for r in runs[n] if r.ok) or 1.0) for n in (na, nb))
    if not (sa["success"] == 1.0 and sb["success"] == 1.0):
        print(f"{label}: failed requests: " + "; ".join(sa["errors"] + sb["errors"]), flush=True)
    fp, rtf = (100 * (sa[k] / sb[k] - 1) for k in ("first_p50", "rtf_p50"))
    print(f"{label} at 1 concurrent (medians of {pairs}): first packet {sa['first_p50']:.2f}s {na} vs "
          f"{sb['first_p50']:.2f}s {nb} ({fp:+.1f}%, ratio {sa['first_p50'] / sb['first_p50']:.2f}); RTF "
          f"{sa['rtf_p50']:.2f} vs {sb['rtf_p50']:.2f} ({rtf:+.1f}%)", flush=True)
    return {na: sa, nb: sb, "first_packet_pct": fp, "rtf_pct": rtf}


def compare_dtypes(model_dir: Path, data_dir: Path, args, dtypes: list[str], first: tuple, levels: list[int],
                   extra: tuple, prefix: tuple, procs: list) -> dict:
    """--dtypes: a second backend and frontend in dtypes[1] beside `first` (targets, metrics, report in
    dtypes[0]); each level on both in turn. Returns {dtype: {"levels": ...}, "ratios": [...]}."""
    from lm_throughput import start_backend
    proc, url = start_backend(model_dir, 8125, args.llm_api_key, (*extra, "--dtype", dtypes[1]), prefix)
    procs.append(proc)
    proc, front = start_frontend(model_dir, data_dir, 8297, argparse.Namespace(**{**vars(args), "dtype": dtypes[1]}),
                                 url, args.frontend_cpus)
    procs.append(proc)
    second = [load.prepare(load.Target(front, args.api_key))]
    load.run_level(second, ["voice"], ["pai"], 1, 1)  # warm-up
    runs = {dtypes[0]: first, dtypes[1]: (second, BackendMetrics(url, args.llm_api_key), {"levels": []})}
    for i, n in enumerate(levels):
        for dt in dtypes if i % 2 == 0 else dtypes[::-1]:
            print(f"-- {dt}", flush=True)
            targets, metrics, report = runs[dt]
            drive(targets, args, metrics, [n], report)
    out = {dt: {"levels": runs[dt][2]["levels"]} for dt in dtypes}
    out["ratios"] = []
    print(f"{dtypes[1]} / {dtypes[0]} (all modes):")
    for a, b in zip(out[dtypes[0]]["levels"], out[dtypes[1]]["levels"]):
        sa, sb = a["all"], b["all"]
        r = {"concurrency": a["concurrency"], **{k: sb[k] / sa[k] if sa[k] else None
                                                 for k in ("first_p50", "rtf_p50", "audio_per_wall")}}
        out["ratios"].append(r)
        print(f"  x{r['concurrency']}: first packet p50 {sa['first_p50']:.2f}s -> {sb['first_p50']:.2f}s "
              f"({r['first_p50']:.2f}x), RTF p50 {sa['rtf_p50']:.2f} -> {sb['rtf_p50']:.2f} ({r['rtf_p50']:.2f}x), "
              f"audio-s per wall-s {sa['audio_per_wall']:.3f} -> {sb['audio_per_wall']:.3f} "
              f"({r['audio_per_wall']:.2f}x)", flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model_dir", type=Path)
    ap.add_argument("--size", choices=("tiny", "full"), default="full")
    ap.add_argument("--frontends", type=int, default=1)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--max_batch", type=int, default=8)
    ap.add_argument("--concurrency", default="1,4,8")
    ap.add_argument("--requests", type=int, default=0)
    ap.add_argument("--llm_stall_timeout", type=float, default=120.0,
                    help="the frontends' (README 'One machine': at x16 on 2 cores, with the backend beside the "
                         "frontends, a starved prefill held streams past 30 s; 120 s let all succeed)")
    ap.add_argument("--modes", default=",".join(load.MODES))
    ap.add_argument("--apis", default="pai,openai")
    ap.add_argument("--tokens", type=int, default=100)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--capacity", action="store_true")
    ap.add_argument("--split_cost", action="store_true")
    ap.add_argument("--baseline_root", type=Path, help="a checkout to compare with, request by request")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--backend_cpus", help="the backend's --cpus (default: vLLM's auto binding)")
    ap.add_argument("--frontend_cpus", help="the frontends' --cpus (default: every CPU)")
    ap.add_argument("--backend_nice", type=int, default=0, help="the backend's --nice N")
    ap.add_argument("--backend_idle", action="store_true", help="start the backend under `chrt --idle 0`")
    ap.add_argument("--backend_url")
    ap.add_argument("--frontend_urls")
    ap.add_argument("--api_key", default=os.environ.get("COSY_API_KEY"), help="the frontends' key, if any")
    ap.add_argument("--llm_api_key", default=os.environ.get("COSY_LLM_API_KEY", "bench-key"))
    ap.add_argument("--dtype", help="both roles' --dtype (default: theirs)")
    ap.add_argument("--dtypes", help="A,B: a second deployment in B beside the one in A, levels alternating")
    args = ap.parse_args()
    dtypes = args.dtypes.split(",") if args.dtypes else []
    if dtypes:
        if len(dtypes) != 2 or args.backend_url or args.frontend_urls:
            ap.error("--dtypes takes two dtypes, and starts its deployments itself (no --backend_url/--frontend_urls)")
        args.dtype = dtypes[0]
    model_dir = args.model_dir or ROOT / ".cache" / f"{args.size}-random"
    if not (model_dir / "llm.pt").exists():
        from cosy.verify.random_model import write_random_model
        write_random_model(model_dir, args.size, seed=0)
    levels = [int(c) for c in args.concurrency.split(",")]
    from provenance import provenance
    procs, report = [], {"provenance": provenance(), "args": {k: str(v) for k, v in vars(args).items()},
                         "levels": []}
    data_dir = Path(tempfile.mkdtemp(prefix="cosy-bench-data-"))
    try:
        llm_url = args.backend_url
        extra = ("--cpus", args.backend_cpus) if args.backend_cpus else ()
        extra += ("--nice", str(args.backend_nice)) if args.backend_nice else ()
        prefix = ("chrt", "--idle", "0") if args.backend_idle else ()
        if not llm_url:
            from lm_throughput import start_backend
            dtype = ("--dtype", args.dtype) if args.dtype else ()
            proc, llm_url = start_backend(model_dir, 8123, args.llm_api_key, (*extra, *dtype), prefix)
            procs.append(proc)
        metrics = BackendMetrics(llm_url, args.llm_api_key)
        if args.frontend_urls:
            urls = args.frontend_urls.split(",")
        else:
            started = [start_frontend(model_dir, data_dir, 8200 + i, args, llm_url, args.frontend_cpus)
                       for i in range(args.frontends)]
            procs += [p for p, _ in started]
            urls = [u for _, u in started]
        targets = [load.prepare(load.Target(u, args.api_key)) for u in urls]
        print(f"model {model_dir}; {args.tokens} tokens per request; {len(urls)} frontend(s) x {args.workers} "
              f"worker(s) x max_batch {args.max_batch}; backend {llm_url}", flush=True)
        load.run_level(targets[:1], ["voice"], ["pai"], 1, 1)  # warm-up
        if args.capacity:
            a = backend_saturation(model_dir, llm_url, args.llm_api_key, args.tokens)
            n = args.workers * args.max_batch * 2
            results, wall = load.run_level(targets[:1], ["voice"], ["pai"], n, n)
            b = sum(r.audio for r in results if r.ok) * TOKEN_RATE / wall
            report["capacity"] = {"backend_tokens_per_s": a, "frontend_tokens_per_s": b, "ratio": a / b}
            print(f"capacity: backend alone {a:.1f} tokens/s (32 LM requests at once); one frontend consumes "
                  f"{b:.1f} tokens/s at saturation ({n} requests in flight: audio-s/wall-s x {TOKEN_RATE}); "
                  f"frontends per backend = {a:.1f} / {b:.1f} = {a / b:.2f}", flush=True)
        if dtypes:
            report["dtypes"] = compare_dtypes(model_dir, data_dir, args, dtypes, (targets, metrics, report),
                                              levels, extra, prefix, procs)
        else:
            drive(targets, args, metrics, levels, report)
        if args.split_cost:
            proc, embedded_url = start_frontend(model_dir, data_dir, 8299, args, None)
            procs.append(proc)
            embedded = load.prepare(load.Target(embedded_url, args.api_key))
            load.run_level([embedded], ["voice"], ["pai"], 1, 1)  # warm-up
            report["split_cost"] = paired("split cost", ("backend", targets[0]), ("embedded", embedded),
                                          max(6, args.requests))
        if args.baseline_root:
            from lm_throughput import start_backend
            root = args.baseline_root.resolve()
            env = {"PYTHONPATH": str(root)}  # its cosy, not this tree's (installed editable)
            proc, base_url = start_backend(model_dir, 8124, args.llm_api_key, extra, prefix, env=env, root=root)
            procs.append(proc)
            proc, base_frontend = start_frontend(model_dir, data_dir, 8298, args, base_url, args.frontend_cpus,
                                                 env=env, root=root)
            procs.append(proc)
            base = load.prepare(load.Target(base_frontend, args.api_key))
            load.run_level([base], ["voice"], ["pai"], 1, 1)  # warm-up
            report["baseline"] = paired("vs baseline", ("this tree", targets[0]), (f"{root}", base),
                                        max(6, args.requests))
    finally:
        for p in reversed(procs):
            stop(p)
        shutil.rmtree(data_dir, ignore_errors=True)  # the run's uploads and saved voices
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
