"""The deployment as users run it: one vLLM backend, two frontends (`app.py --llm_base_url`) on one data dir.

A reference audio made on one frontend is used from the other (readiness following a killed and restarted
backend, without a restart of the frontends: test_faults.py). Behind a real HAProxy (`cosy.deploy.haproxy`): a
bounded load test (32 concurrent streaming requests, loopback only) completes every response over both
frontends and prints first-packet p50/p95 and RTF; traffic reaches only frontends whose /ready passes, SSE
passes unbuffered, a duplex WebSocket task is upgraded through it, gradio_client and the WebUI in a real browser
stick to one frontend, and a frontend killed mid-run fails only its own streams, is taken out by the health check,
and leaves new requests to the survivor.
"""
from __future__ import annotations

import asyncio
import base64
import csv
import http.server
import io
import json
import shutil
import socket
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
SHORT_TEXT = "你好，世界。"


@pytest.fixture(scope="module")
def apps(backend, tiny_model_dir, tmp_path_factory):
    data = tmp_path_factory.mktemp("nas")
    common = ["--model_dir", str(tiny_model_dir), "--data_dir", str(data), "--workers", "2",
              "--llm_base_url", backend.url, "--llm_api_key", backend.api_key,
              # the one-machine advice (README): a backend beside busy frontends (and, in the parallel run,
              # another test worker) may starve for longer than the 5 s default between tokens
              "--llm_stall_timeout", "60",
              # 75 speech tokens (three streaming chunks, 3 s) a segment: what this module checks is the
              # plumbing, and the random LM seldom stops before 20 tokens per text token
              "--fixed_tokens", "75"]
    started = start_apps(common, common)
    yield started
    for a in started:
        a.stop()


@pytest.fixture(scope="module")
def frontends(apps):
    return [a.url.rstrip("/") for a in apps]


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


def _stream_one(url: str, ref: str, i: int, text: str = TEXT) -> dict:
    """One PAI streaming request; first-packet time, total time, audio seconds and the frontend that served
    it (the proxy's header, if any), all chunks checked."""
    body = {"model": "CosyVoice2-0.5B", "input": {"mode": "fast_replication", "text": text,
                                                  "reference_audio_id": ref},
            "output_format": "pcm", "stream": True, "seed": i}
    start, first, samples, finished = time.monotonic(), None, 0, None
    with httpx.stream("POST", f"{url}/api/v1/audio/speech", json=body, timeout=300) as r:
        assert r.status_code == 200, r.read()
        served_by = r.headers.get(haproxy.SERVER_HEADER)
        for line in r.iter_lines():
            if not line.startswith("data:"):
                continue
            event = json.loads(line[5:])
            first = first or time.monotonic() - start
            samples += len(base64.b64decode(event["output"]["audio"]["data"])) // 2
            finished = event["output"]["finish_reason"]
    return {"first": first, "total": time.monotonic() - start, "audio": samples / 24000, "finish": finished,
            "frontend": served_by}


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


class Proxy(str):
    """The proxy's URL, with `.stats()`: each server's status from HAProxy's stats socket."""

    socket: str

    def stats(self) -> dict[str, str]:
        with socket.socket(socket.AF_UNIX) as s:
            s.connect(self.socket)
            s.sendall(b"show stat\n")
            text = b"".join(iter(lambda: s.recv(65536), b"")).decode()
        rows = list(csv.reader(text.lstrip("# ").splitlines()))
        head = rows[0]
        return {r[head.index("svname")]: r[head.index("status")] for r in rows[1:]
                if len(r) == len(head) and r[0] == "cosy_frontends"}


def test_proxy_config_is_valid_and_refuses_bad_values(tmp_path, capsys):
    """`python -m cosy.deploy.haproxy`: HAProxy itself accepts the file; a check may take its own timeout
    (not the interval, HAProxy's default); bad addresses and timings are refused with their names."""
    cfg = tmp_path / "haproxy.cfg"
    cfg.write_text(haproxy.render("127.0.0.1:8080", ["10.0.0.11:50000", "10.0.0.12:50000"], check_interval_s=0.5,
                                  check_timeout_s=7))
    check = subprocess.run(["haproxy", "-c", "-f", str(cfg)], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    text = cfg.read_text()
    assert "timeout check 7000ms" in text and "inter 500ms fall 2 rise 2" in text
    for bad, says in ((["--check_timeout", "0"], "positive seconds"), (["--check_interval", "-1"], "positive seconds"),
                      (["--frontend", "nohost"], "not HOST:PORT: 'nohost'")):
        with pytest.raises(SystemExit) as exit_:
            haproxy.main(["--frontend", "10.0.0.11:1", *bad])
        err = capsys.readouterr().err
        assert exit_.value.code == 2 and says in err, err


@pytest.fixture(scope="module")
def proxy(frontends, tmp_path_factory):
    if shutil.which("haproxy") is None:
        pytest.fail("haproxy is not installed: the README's test command installs Debian's haproxy package")
    never = http.server.ThreadingHTTPServer(("127.0.0.1", 0), NeverReady)
    threading.Thread(target=never.serve_forever, daemon=True).start()
    port = free_port()
    members = [u.split("//")[1] for u in frontends] + [f"127.0.0.1:{never.server_address[1]}"]
    folder = tmp_path_factory.mktemp("haproxy")
    cfg = folder / "haproxy.cfg"
    cfg.write_text(haproxy.render(f"127.0.0.1:{port}", members, check_interval_s=0.5,
                                  stats_socket=str(folder / "stats.sock")))
    proc = subprocess.Popen(["haproxy", "-f", str(cfg)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    url = Proxy(f"http://127.0.0.1:{port}")
    url.socket = str(folder / "stats.sock")
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


def _reference(url: str) -> str:
    with open(ASSETS / "zero_shot_prompt.wav", "rb") as f:
        return httpx.post(f"{url}/api/v1/audio/reference_audio", files={"file": ("p.wav", f)},
                          data={"text": ZS_TEXT}, timeout=120).json()["id"]


def test_load_32_concurrent_streams_through_the_proxy(proxy):
    """32 streaming requests at once through HAProxy to two frontends (2 workers each) and one backend."""
    ref = _reference(proxy)
    start = time.monotonic()
    with ThreadPoolExecutor(32) as pool:  # short texts: the point is 32 at once, not their length
        results = list(pool.map(lambda i: _stream_one(proxy, ref, i, SHORT_TEXT), range(32)))
    wall = time.monotonic() - start
    assert all(r["finish"] == "stop" and r["audio"] > 0.5 for r in results)  # zero failures, all complete
    served = [r["frontend"] for r in results]
    assert min(served.count("fe1"), served.count("fe2")) >= 8, served  # least connections spreads them
    firsts = sorted(r["first"] for r in results)
    rtfs = [r["total"] / r["audio"] for r in results]
    audio = sum(r["audio"] for r in results)
    print(f"\n32 streams through HAProxy over 2 frontends + 1 backend: first packet p50 "
          f"{statistics.median(firsts):.2f} s, p95 {firsts[int(0.95 * 31)]:.2f} s; RTF p50 "
          f"{statistics.median(rtfs):.2f}; {audio:.1f} s of audio in {wall:.1f} s wall")


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


def test_webui_through_the_proxy_in_a_browser(proxy):
    """The WebUI (Gradio's queue is per process) generates through HAProxy: the affinity cookie keeps the
    page's upload, queue join and event stream on one frontend."""
    from playwright.sync_api import sync_playwright
    from test_webui import ARGS, CHROMIUM, generate, upload_prompt
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 1400})
            page.set_default_timeout(90_000)
            page.goto(proxy + "/", wait_until="networkidle")
            upload_prompt(page, "zero_shot_prompt.wav")
            page.locator("#prompt_text textarea").fill(ZS_TEXT)
            page.locator("#tts_text textarea").fill("你好。今天天气很好。")
            page.locator("#stream input").check()
            generate(page)
            cookies = {c["name"]: c["value"] for c in page.context.cookies()}
            assert cookies.get(haproxy.AFFINITY_COOKIE) in ("fe1", "fe2"), cookies
        finally:
            browser.close()


def _stream_until_done(url: str, ref: str, i: int, text: str, streaming: dict) -> dict:
    """A long PAI stream that records which frontend serves it in `streaming[i]` while its audio flows
    (the key goes when it ends) and ends with its outcome: "stop", or the error the client saw."""
    body = {"model": "CosyVoice2-0.5B", "input": {"mode": "fast_replication", "text": text,
                                                  "reference_audio_id": ref},
            "output_format": "pcm", "stream": True, "seed": i}
    out = {"frontend": None, "outcome": None, "ended": None}
    try:
        with httpx.stream("POST", f"{url}/api/v1/audio/speech", json=body, timeout=300) as r:
            out["frontend"] = r.headers.get(haproxy.SERVER_HEADER)
            if r.status_code != 200:
                out["outcome"] = f"HTTP {r.status_code}"
                return out
            for line in r.iter_lines():
                if line.startswith("data:"):
                    streaming[i] = out["frontend"]  # audio is flowing on this frontend
                    out["outcome"] = json.loads(line[5:])["output"]["finish_reason"]
    except httpx.HTTPError as e:
        out["outcome"] = type(e).__name__
    finally:
        streaming.pop(i, None)
    out["ended"] = time.monotonic()
    return out


def test_frontend_killed_mid_run_leaves_the_survivor_serving(proxy, apps):
    """(Last in the module: it kills fe1.) Streams in flight on the killed frontend fail with a transport
    error, never a clean end of audio; those on the other finish; the health check takes fe1 out and new
    requests all go to fe2."""
    import psutil
    ref = _reference(proxy)
    streaming: dict[int, str] = {}
    with ThreadPoolExecutor(8) as pool:
        futures = [pool.submit(_stream_until_done, proxy, ref, i, TEXT * 2, streaming) for i in range(8)]
        deadline = time.monotonic() + 120
        # audio flowing from both at once: a stream fe1 has already finished is no stream to cut off
        while set(streaming.values()) != {"fe1", "fe2"}:
            assert time.monotonic() < deadline and not all(f.done() for f in futures), streaming
            time.sleep(0.1)
        victim = psutil.Process(apps[0].proc.pid)
        for proc in [victim, *victim.children(recursive=True)]:  # the app and its workers, as a crash would
            proc.kill()
        killed_at = time.monotonic()
        results = [f.result() for f in futures]
    # a stream fe1 finished before the kill is no failure: only those still running must be cut off
    done_before = [r for r in results if r["outcome"] == "stop" and r["ended"] < killed_at]
    on_fe1 = [r["outcome"] for r in results if r["frontend"] == "fe1" and r not in done_before]
    on_fe2 = [r["outcome"] for r in results if r["frontend"] == "fe2"]
    # requests fe1 had taken but not yet answered: HAProxy's own 502 (which carries no frontend name)
    unanswered = [r["outcome"] for r in results if r["frontend"] is None]
    assert on_fe1 and on_fe2 and len(on_fe1) + len(on_fe2) + len(unanswered) + len(
        [r for r in done_before if r["frontend"] == "fe1"]) == 8, results
    assert all(o in ("RemoteProtocolError", "ReadError") for o in on_fe1), results  # cut off, never "stop"
    assert all(o == "HTTP 502" for o in unanswered), results
    assert all(o == "stop" for o in on_fe2), results
    deadline = time.monotonic() + 30
    while proxy.stats().get("fe1") != "DOWN":
        assert time.monotonic() < deadline, proxy.stats()
        time.sleep(0.2)
    assert proxy.stats()["fe2"] == "UP"
    after = [_stream_one(proxy, ref, 100 + i) for i in range(2)]
    assert all(r["finish"] == "stop" and r["audio"] > 0.5 and r["frontend"] == "fe2" for r in after), after
