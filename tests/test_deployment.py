"""The deployment as users run it: one vLLM backend, two frontends (`app.py --llm_base_url`) on one data dir.

Readiness follows the backend without restarting frontends; a reference audio made on one frontend is used
from the other; a bounded load test (32 concurrent streaming requests, loopback only) completes every
response and prints first-packet p50/p95 and RTF. Behind a real HAProxy (`cosy.deploy.haproxy`): traffic
reaches only frontends whose /ready passes, SSE passes unbuffered, a duplex WebSocket task is upgraded through it,
and gradio_client sticks to one frontend.
"""
from __future__ import annotations

import asyncio
import base64
import http.server
import io
import json
import shutil
import statistics
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest
import soundfile as sf
import websockets
from conftest import ASSETS
from gradio_client import Client, handle_file
from servers import free_port, start_apps
from test_ws import SHORT_PIECES, one_task

from cosy.deploy import haproxy

ZS_TEXT = "希望你以后能够做的比我还好呦。"
TEXT = "今天天气很好，我们一起去公园散步吧。"


@pytest.fixture(scope="module")
def frontends(backend, tiny_model_dir, tmp_path_factory):
    data = tmp_path_factory.mktemp("nas")
    common = ["--model_dir", str(tiny_model_dir), "--data_dir", str(data), "--workers", "2",
              "--llm_base_url", backend.url, "--llm_api_key", backend.api_key]
    apps = start_apps(common, common)
    yield [a.url.rstrip("/") for a in apps]
    for a in apps:
        a.stop()


def wait_ready(url: str, want: int, timeout: float = 120) -> httpx.Response:
    deadline = time.monotonic() + timeout
    while True:
        r = httpx.get(f"{url}/ready", timeout=10)
        if r.status_code == want or time.monotonic() > deadline:
            return r
        time.sleep(1)


def test_ready_follows_the_backend(frontends, backend):
    a, _ = frontends
    assert httpx.get(f"{a}/ready").status_code == 200
    backend.stop(grace=10)
    try:
        r = wait_ready(a, 503)
        assert r.status_code == 503 and "not ready" in r.text, r.text
        assert backend.url.split("//")[1].split("/")[0] not in r.text  # no host named to anyone who asks
        assert httpx.get(f"{a}/health").status_code == 200  # the process itself is up
    finally:
        backend.start()
    assert wait_ready(a, 200).status_code == 200  # same frontend process, no restart


def test_reference_audio_from_one_frontend_used_on_the_other(frontends):
    a, b = frontends
    with open(ASSETS / "zero_shot_prompt.wav", "rb") as f:
        r = httpx.post(f"{a}/api/v1/audio/reference_audio", files={"file": ("me.wav", f, "audio/wav")},
                       data={"text": ZS_TEXT}, timeout=120)
    assert r.status_code == 200, r.text
    ref = r.json()["id"]
    client = openai.OpenAI(base_url=f"{b}/v1", api_key="unused")
    audio = client.audio.speech.create(model="CosyVoice2-0.5B", voice=ref, input=TEXT, response_format="wav")
    assert audio.content[:4] == b"RIFF" and len(audio.content) > 24000
    assert ref in [v["id"] for v in httpx.get(f"{b}/api/v1/audio/reference_audio").json()]


def _stream_one(url: str, ref: str, i: int) -> dict:
    """One PAI streaming request; first-packet time, total time and audio seconds, all chunks checked."""
    body = {"model": "CosyVoice2-0.5B", "input": {"mode": "fast_replication", "text": TEXT,
                                                  "reference_audio_id": ref},
            "output_format": "pcm", "stream": True, "seed": i}
    start, first, samples, finished = time.monotonic(), None, 0, None
    with httpx.stream("POST", f"{url}/api/v1/audio/speech", json=body, timeout=300) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if not line.startswith("data:"):
                continue
            event = json.loads(line[5:])
            first = first or time.monotonic() - start
            samples += len(base64.b64decode(event["output"]["audio"]["data"])) // 2
            finished = event["output"]["finish_reason"]
    return {"first": first, "total": time.monotonic() - start, "audio": samples / 24000, "finish": finished}


def test_load_32_concurrent_streams_over_two_frontends(frontends):
    with open(ASSETS / "zero_shot_prompt.wav", "rb") as f:
        ref = httpx.post(f"{frontends[0]}/api/v1/audio/reference_audio", files={"file": ("p.wav", f)},
                         data={"text": ZS_TEXT}, timeout=120).json()["id"]
    start = time.monotonic()
    with ThreadPoolExecutor(32) as pool:
        results = list(pool.map(lambda i: _stream_one(frontends[i % 2], ref, i), range(32)))
    wall = time.monotonic() - start
    assert all(r["finish"] == "stop" and r["audio"] > 0.5 for r in results)  # zero failures, all complete
    firsts = sorted(r["first"] for r in results)
    rtfs = [r["total"] / r["audio"] for r in results]
    audio = sum(r["audio"] for r in results)
    print(f"\n32 streams over 2 frontends + 1 backend: first packet p50 {statistics.median(firsts):.2f} s, "
          f"p95 {firsts[int(0.95 * 31)]:.2f} s; RTF p50 {statistics.median(rtfs):.2f}; "
          f"{audio:.1f} s of audio in {wall:.1f} s wall")


# --- the frontends behind a real HAProxy (Debian's package), configured by cosy.deploy.haproxy ---

class NeverReady(http.server.BaseHTTPRequestHandler):
    """A server that answers every request, but /ready with 503: the proxy must never send it traffic."""

    def do_GET(self):  # noqa: N802 (http.server's naming)
        self.send_response(503 if self.path == "/ready" else 200)
        self.end_headers()
        self.wfile.write(b"never-ready")

    do_POST = do_GET

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def proxy(frontends, tmp_path_factory):
    if shutil.which("haproxy") is None:
        pytest.fail("haproxy is not installed: the README's test command installs Debian's haproxy package")
    never = http.server.ThreadingHTTPServer(("127.0.0.1", 0), NeverReady)
    threading.Thread(target=never.serve_forever, daemon=True).start()
    port = free_port()
    members = [u.split("//")[1] for u in frontends] + [f"127.0.0.1:{never.server_address[1]}"]
    cfg = tmp_path_factory.mktemp("haproxy") / "haproxy.cfg"
    cfg.write_text(haproxy.render(f"127.0.0.1:{port}", members, check_interval_s=0.5))
    proc = subprocess.Popen(["haproxy", "-f", str(cfg)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:  # up once both frontends passed two checks (fe3 never does)
        try:
            seen = {httpx.get(f"{url}/ready", timeout=5).headers.get(haproxy.SERVER_HEADER) for _ in range(6)}
            if seen == {"fe1", "fe2"}:
                break
        except httpx.TransportError:
            pass
        assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read().decode()
        time.sleep(0.5)
    yield url
    proc.terminate()
    proc.wait(10)
    never.shutdown()


def test_proxy_balances_over_ready_frontends_only(proxy):
    served = [httpx.get(f"{proxy}/ready", timeout=10) for _ in range(20)]
    assert all(r.status_code == 200 and r.text != "never-ready" for r in served)
    names = [r.headers[haproxy.SERVER_HEADER] for r in served]
    assert set(names) == {"fe1", "fe2"} and min(names.count("fe1"), names.count("fe2")) >= 5, names


def test_proxy_streams_sse_unbuffered(proxy, frontends):
    """Events arrive through the proxy as the frontend writes them, not when the response ends."""
    with open(ASSETS / "zero_shot_prompt.wav", "rb") as f:
        ref = httpx.post(f"{proxy}/api/v1/audio/reference_audio", files={"file": ("p.wav", f)},
                         data={"text": ZS_TEXT}, timeout=120).json()["id"]
    body = {"model": "CosyVoice2-0.5B", "stream": True, "output_format": "pcm",
            "input": {"mode": "fast_replication", "text": TEXT * 4, "reference_audio_id": ref}}
    arrivals, start = [], time.monotonic()
    with httpx.stream("POST", f"{proxy}/api/v1/audio/speech", json=body, timeout=300) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        for line in r.iter_lines():
            if line.startswith("data:"):
                arrivals.append(time.monotonic() - start)
                assert json.loads(line[5:])["error"] is None
    assert len(arrivals) >= 3, arrivals
    # a buffering proxy delivers every event at the end, within milliseconds of each other
    assert arrivals[-1] - arrivals[0] > 0.2 and arrivals[0] < 0.8 * arrivals[-1], arrivals


def test_gradio_client_through_proxy_sticks_to_one_frontend(proxy):
    """Gradio's queue is per process: the affinity cookie keeps a client's join and data on one frontend."""
    client = Client(proxy + "/", verbose=False)
    assert haproxy.AFFINITY_COOKIE in client.cookies
    for seed in range(4):  # without affinity, about half of these would join on one process, poll the other
        wav = client.predict("你好。", ZS_TEXT, handle_file(str(ASSETS / "zero_shot_prompt.wav")), seed, 1.0,
                             api_name="/zero_shot")
        assert sf.info(wav).frames > 0


def test_duplex_websocket_through_proxy_with_the_backend(proxy):
    """The PAI duplex task over a WebSocket upgraded through HAProxy, the LM on the real vLLM backend."""
    with open(ASSETS / "zero_shot_prompt.wav", "rb") as f:
        ref = httpx.post(f"{proxy}/api/v1/audio/reference_audio", files={"file": ("p.wav", f)},
                         data={"text": ZS_TEXT}, timeout=120).json()["id"]

    async def main():
        async with websockets.connect(proxy.replace("http://", "ws://") + "/api-ws/v1/audio/speech",
                                      max_size=None) as ws:
            return await one_task(ws, ref, SHORT_PIECES, 0.05)

    _, events, audio, _ = asyncio.run(main())
    kinds = [e["header"]["event"] for e in events]
    assert kinds[-1] == "task-finished" and set(kinds[:-1]) == {"result-generated"}, events[-1]
    wav, rate = sf.read(io.BytesIO(audio))
    total = sum(e["payload"]["metrics"]["speech_len"] for e in events[:-1])
    assert rate == 24000 and len(wav) > 0 and abs(len(wav) / rate - total) < 0.01
