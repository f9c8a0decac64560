"""The backend failing under load, for real: one frontend (2 workers x 4 streams, so half of 16 requests queue)
on the session's vLLM backend, 16 PAI SSE streams in flight, then the backend SIGKILLed (and restarted) or
frozen (SIGSTOP, then SIGCONT). Every request ends within a bound, finished or with an error that names the
LM backend (never its address, never a 500); once the backend is back, the same frontend serves again without
a restart. Each test prints what was lost, the errors the clients saw and the time to recover. (A stream
that holds its segment's tokens when the backend goes keeps speaking them; it fails when it needs the LM.)

While the killed backend is down, the frontend's /ready says so (without the backend's address) and /health
stays up: readiness follows the backend with no restart of the frontend (this was test_deployment's own
graceful restart of the shared backend, one vLLM start more). A graceful stop (SIGTERM: exit 0, port freed)
is test_backend_server's, on the backend it is done with."""
from __future__ import annotations

import json
import os
import signal
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from conftest import ASSETS
from servers import App

ZS_TEXT = "希望你以后能够做的比我还好呦。"
TEXT = "今天天气很好，我们一起去公园散步，看看花草树木，听听鸟儿唱歌。" * 4
STALL = 3.0
STREAMS = 16


@pytest.fixture(scope="module")
def frontend(backend, tiny_model_dir, tmp_path_factory):
    data = tmp_path_factory.mktemp("data")
    app = App("--model_dir", str(tiny_model_dir), "--data_dir", str(data),
              "--workers", "2", "--max_batch", "4", "--llm_base_url", backend.url, "--llm_api_key", backend.api_key,
              "--llm_stall_timeout", str(STALL)).wait()
    url = app.url.rstrip("/")
    r = httpx.post(f"{url}/api/v1/audio/reference_audio", files={"file": ("p.wav", (ASSETS / "zero_shot_prompt.wav")
                                                                         .read_bytes())},
                   data={"text": ZS_TEXT}, timeout=120)
    assert r.status_code == 200, r.text
    yield url, r.json()["id"], app, data
    app.stop()


def _stream(url: str, ref: str, i: int, flowing: set) -> dict:
    """One PAI SSE stream: how it ended ("stop", or the error message the client saw), and when."""
    body = {"model": "CosyVoice2-0.5B", "stream": True, "seed": i,
            "input": {"mode": "fast_replication", "text": TEXT, "reference_audio_id": ref, "output_format": "pcm"}}
    out = {"outcome": None, "error": None, "status": None, "last_audio": None}
    with httpx.stream("POST", f"{url}/api/v1/audio/speech", json=body, timeout=120) as r:
        out["status"] = r.status_code
        if r.status_code != 200:  # refused before any audio: a JSON error answer
            out["outcome"], out["error"] = f"HTTP {r.status_code}", json.loads(r.read())["error"]["message"]
        for line in r.iter_lines() if r.status_code == 200 else ():
            if line.startswith("data:"):
                event = json.loads(line[5:])
                flowing.add(i)
                if event["output"]["audio"]["data"]:
                    out["last_audio"] = time.monotonic()
                if event["error"]:
                    out["outcome"], out["error"] = "error event", event["error"]["message"]
                elif event["output"]["finish_reason"] == "stop":
                    out["outcome"] = "stop"
    out["ended"] = time.monotonic()
    return out


def _under_load(url: str, ref: str, fault) -> tuple[list[dict], float]:
    """16 streams; `fault()` once 4 have audio flowing; their outcomes and the fault's time."""
    flowing: set[int] = set()
    with ThreadPoolExecutor(STREAMS) as pool:
        futures = [pool.submit(_stream, url, ref, i, flowing) for i in range(STREAMS)]
        deadline = time.monotonic() + 180
        while len(flowing) < 4:
            assert time.monotonic() < deadline and not all(f.done() for f in futures), flowing
            time.sleep(0.05)
        at = time.monotonic()
        fault()
        return [f.result() for f in futures], at


def _check(results: list[dict], at: float, backend, what: str) -> None:
    """Nothing hung, nothing answered 500, every failure named and redacted, and a stream that was sending
    audio got its error soon after its audio stopped (it spoke the tokens it had, then needed the backend);
    the figures printed."""
    port = backend.url.rsplit(":", 1)[1].split("/")[0]
    lost = [r for r in results if r["outcome"] != "stop"]
    gaps = [r["ended"] - max(at, r["last_audio"]) for r in lost if r["last_audio"]]
    print(f"\n{what} under {STREAMS} streams: {len(lost)} lost, {STREAMS - len(lost)} finished; outcomes "
          f"{dict(Counter(r['outcome'] for r in results))}; errors {dict(Counter(r['error'] for r in lost))}; "
          f"ended at (s after the fault) {sorted(round(r['ended'] - at, 1) for r in results)}; error after the "
          f"last audio (s) {sorted(round(g, 1) for g in gaps)}")
    assert lost, "the fault came after every stream had finished: it tested nothing"
    assert max(r["ended"] for r in results) - at < 110, results  # the client's own timeout is 120 s
    assert gaps and max(gaps) < STALL + 5, gaps
    for r in lost:
        assert r["outcome"] in ("error event", "HTTP 503"), r
        assert "LM backend" in r["error"] and f":{port}" not in r["error"] and "127.0.0.1" not in r["error"], r


def _recovered(url: str, ref: str, since: float) -> float:
    """Seconds from `since` until the same frontend is ready and a synthesis succeeds."""
    deadline = time.monotonic() + 60
    while httpx.get(f"{url}/ready", timeout=10).status_code != 200:
        assert time.monotonic() < deadline, "the frontend never became ready again"
        time.sleep(0.2)
    body = {"model": "CosyVoice2-0.5B", "stream": False,
            "input": {"mode": "fast_replication", "text": "你好。", "reference_audio_id": ref}}
    r = httpx.post(f"{url}/api/v1/audio/speech", json=body, timeout=120)
    assert r.status_code == 200 and r.json()["output"]["audio"]["data"], r.text
    return time.monotonic() - since


def _wait_ready_status(url: str, want: int, timeout: float = 60) -> httpx.Response:
    """The frontend's /ready answer once it is `want`, or the last one after `timeout` s."""
    deadline = time.monotonic() + timeout
    while (r := httpx.get(f"{url}/ready", timeout=10)).status_code != want and time.monotonic() < deadline:
        time.sleep(0.2)
    return r


def test_backend_killed_under_16_streams_then_restarted(frontend, backend, tiny_model_dir):
    """... and a frontend started while the backend is down starts (as compose and Kubernetes start them, in
    any order): /health up, /ready 503 with the reason in its log, then it serves once the backend is back.
    It once failed its start instead, and compose restarted it, a whole model load each time, until the
    backend answered."""
    url, ref, app, data = frontend
    pid = app.proc.pid
    host = backend.url.split("//")[1].split("/")[0]
    late = None
    try:
        results, at = _under_load(url, ref, backend.crash)
        # the frontend's readiness follows the backend; the process itself is up
        r = _wait_ready_status(url, 503)
        assert r.status_code == 503 and "not ready" in r.text and host not in r.text, r.text
        assert httpx.get(f"{url}/health", timeout=10).status_code == 200
        late = App("--model_dir", str(tiny_model_dir), "--data_dir", str(data), "--llm_base_url", backend.url,
                   "--llm_api_key", backend.api_key).wait()
        late_url = late.url.rstrip("/")
        assert httpx.get(f"{late_url}/health", timeout=10).status_code == 200
        assert httpx.get(f"{late_url}/ready", timeout=10).status_code == 503
        said = "".join(late.lines)
        assert "not ready yet: cannot reach the LM backend" in said and "failed to start" not in said, said
    finally:
        start = time.monotonic()
        backend.start()
        ready_at = time.monotonic()
    try:
        # refused connections fail at once; the bound is one stall timeout plus a stream's last chunk
        _check(results, at, backend, "backend SIGKILLed")
        took = _recovered(url, ref, ready_at)
        print(f"backend back after {ready_at - start:.1f} s of start-up; the frontend served again {took:.1f} s "
              "later")
        assert took < 30 and app.proc.pid == pid and app.proc.poll() is None  # no frontend restart
        assert _recovered(late_url, ref, ready_at) < 40 and late.proc.poll() is None  # the voice saved on the other
    finally:
        if late is not None:
            late.stop()


def _process_groups(pid: int) -> set[int]:
    import psutil
    root = psutil.Process(pid)
    return {os.getpgid(p.pid) for p in (root, *root.children(recursive=True))}


def test_backend_frozen_under_16_streams_then_thawed(frontend, backend):
    url, ref, app, _ = frontend
    groups = _process_groups(backend.proc.pid)

    def freeze():
        for g in groups:
            os.killpg(g, signal.SIGSTOP)

    try:
        results, at = _under_load(url, ref, freeze)
    finally:
        for g in groups:
            os.killpg(g, signal.SIGCONT)
    thawed = time.monotonic()
    _check(results, at, backend, "backend frozen (SIGSTOP)")
    assert any("stalled" in r["error"] for r in results if r["error"]), results  # the stall clock named it
    took = _recovered(url, ref, thawed)
    print(f"after SIGCONT the frontend served again in {took:.1f} s")
    assert took < 30 and app.proc.poll() is None
