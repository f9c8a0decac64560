"""Nothing left behind and no work outliving its requester: refused uploads deleted, bounded stores, a
clean SIGTERM; clients that leave (queued, in the LM, mid-stream; streaming or not) free their worker and
queue place within LEFT_WITHIN s; a frozen backend (SIGSTOP) fails a request, or loses it to another
backend, within the stall timeout, and /ready agrees with the backend pool."""
from __future__ import annotations

import io
import json
import os
import signal
import socket
import threading
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
import soundfile as sf
from conftest import ASSETS
from servers import App, free_port, metric

from cosy.frontend import store

ZS_TEXT = "希望你以后能够做的比我还好呦。"
# How soon a worker or queue place is free again after its client left. The cancel itself takes well under a
# second on an idle machine (the printed times); this bound leaves room for a run that keeps both cores busy
# (CI once saw 2.005 s), and still fails a job that runs on: LONG is 6 segments of 400 tokens each
# (`frontend`'s --fixed_tokens), 2400 tokens and 96 s of audio, far more than LEFT_WITHIN s of work
LEFT_WITHIN = 6.0
LONG = "今天天气很好，我们一起去公园散步，看看花草树木，听听鸟儿唱歌。" * 12
STALL = 2.0


def temp_root(pid: int) -> Path:
    return store.TEMP_ROOT.parent / f"cosy-frontend-{pid}"


def test_prune_by_age_and_size(tmp_path):
    now = time.time()
    for i in range(6):
        p = tmp_path / ("sub" if i % 2 else "") / f"f{i}"
        p.parent.mkdir(exist_ok=True)
        p.write_bytes(b"x" * 1000)
        os.utime(p, (now - 100 * i, now - 100 * i))
    left = store.prune(tmp_path, store.Bounds(max_age=450, max_bytes=2500), keep=tmp_path / "sub" / "f3")
    names = sorted(p.name for p in tmp_path.rglob("f*"))
    assert names == ["f0", "f3"] and left == 2000  # f4, f5 too old; f1, f2 the oldest over 2500 B (f3 kept)


@pytest.mark.quick
def test_the_webuis_example_files_outlive_the_pruner(tmp_path):
    """gradio caches the WebUI's example prompts when the page is built, as copies that keep the assets' old
    modification times: by age the first pass removed them (the examples failed 30 s after start, "the
    uploaded prompt audio could not be read"). The pruner keeps what was there once the page was built."""
    import shutil

    from conftest import ASSETS

    gradio = tmp_path / "gradio"
    example = gradio / "89e0" / "cross_lingual_prompt.wav"
    example.parent.mkdir(parents=True)
    shutil.copy2(ASSETS / "cross_lingual_prompt.wav", example)  # as gradio copies it
    os.utime(example, (time.time() - 7200, time.time() - 7200))  # assets checked out two hours ago
    bounds = store.Bounds(max_age=600, max_bytes=1 << 30)
    pruner = store.Pruner([(gradio, bounds)], interval=0.05)
    store.pin(gradio)  # (app.py: right after building the page)
    upload = gradio / "ab12" / "old_upload.wav"
    upload.parent.mkdir()
    upload.write_bytes(b"x")
    os.utime(upload, (time.time() - 7200, time.time() - 7200))
    pruner.start()
    deadline = time.monotonic() + 10
    while upload.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    pruner.stop()
    assert not upload.exists() and example.exists()  # an old upload goes; the example stays
    assert store.pinned(example)  # (nor does a refused upload of the same file remove it: gradio_api._Uploads)
    assert store.prune(gradio, bounds) == 0 and not example.exists()  # (unpinned, it would go at once)


@pytest.mark.quick
def test_a_killed_frontends_temp_root_is_removed_by_the_next_one(tmp_path):
    """Real processes: one holds its root's lock (alive), one held it and was SIGKILLed (orphaned); a root
    without a lock goes only when no process has its PID."""
    import subprocess
    import sys
    claim = "from cosy.frontend import store; store.claim_temp_root(); print(store.TEMP_ROOT, flush=True); " \
            "import time; time.sleep(60)"
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    alive, killed = (subprocess.Popen([sys.executable, "-c", claim], env=env, stdout=subprocess.PIPE, text=True)
                     for _ in range(2))
    try:
        roots = {p: Path(p.stdout.readline().strip()) for p in (alive, killed)}
        killed.kill()
        killed.wait()
        no_lock_dead = tmp_path / f"{store.TEMP_PREFIX}{killed.pid}x"  # not a PID: never ours to remove
        no_lock_alive = tmp_path / f"{store.TEMP_PREFIX}{os.getpid()}"
        for d in (no_lock_dead, no_lock_alive):
            d.mkdir()
        gone = store.remove_orphaned_temp_roots(tmp_path)
        assert gone == [roots[killed]] and not roots[killed].exists()
        assert roots[alive].is_dir() and no_lock_dead.is_dir() and no_lock_alive.is_dir()
        alive.kill()
        alive.wait()
        no_lock_alive.rename(tmp_path / f"{store.TEMP_PREFIX}{killed.pid}")  # a PID nobody has now
        assert sorted(store.remove_orphaned_temp_roots(tmp_path)) == sorted(
            [roots[alive], tmp_path / f"{store.TEMP_PREFIX}{killed.pid}"])
    finally:
        for p in (alive, killed):
            p.kill()


def _silence_wav(seconds: float) -> bytes:
    buf = io.BytesIO()
    sf.write(buf, np.zeros(int(16000 * seconds), np.float32), 16000, format="WAV")
    return buf.getvalue()


def test_app_deletes_refused_uploads_and_stops_cleanly(tiny_model_dir, tmp_path):
    from gradio_client import handle_file
    data = tmp_path / "data"
    app = App("--model_dir", str(tiny_model_dir), "--data_dir", str(data), "--uploads_max_mb", "1").wait()
    try:
        root = temp_root(app.proc.pid)
        c = app.client()
        bad = tmp_path / "short.wav"
        bad.write_bytes(_silence_wav(0.1))  # too short: refused by the worker
        with pytest.raises(Exception, match="short|0.5"):
            c.predict("你好。", ZS_TEXT, handle_file(str(bad)), 0, 1.0, api_name="/zero_shot")
        assert list((data / "uploads").iterdir()) == []  # our copy went at once
        assert not [p for p in (root / "gradio").rglob("short.wav")]  # and gradio's
        wav = c.predict("你好。", ZS_TEXT, handle_file(str(ASSETS / "zero_shot_prompt.wav")), 0, 1.0,
                        api_name="/zero_shot")
        assert Path(wav).stat().st_size > 1000
        assert len(list((data / "uploads").iterdir())) == 1  # accepted: kept (within the bounds)
        assert list((root / "results").iterdir())
    finally:
        app.proc.send_signal(signal.SIGTERM)
        start = time.monotonic()
        app.proc.wait(15)
        took = time.monotonic() - start
    time.sleep(0.5)  # the output reader
    out = "".join(app.lines)
    assert took < 8 and app.proc.returncode == 0, out
    assert "Traceback" not in out and "EOFError" not in out, out
    assert not root.exists()


# ---- cancellation, against the real backend -------------------------------------------------------------

@pytest.fixture(scope="module")
def frontend(backend, tiny_model_dir, tmp_path_factory):
    data = tmp_path_factory.mktemp("data")
    # one request at a time (--max_batch 1), so that others wait in the queue and leaving it can be seen; every
    # request 400 tokens long (a random LM may stop at once: a job that ends before it is seen busy proves nothing)
    app = App("--model_dir", str(tiny_model_dir), "--data_dir", str(data), "--workers", "1", "--max_batch", "1",
              "--llm_base_url", backend.url, "--llm_api_key", backend.api_key,
              "--llm_stall_timeout", str(STALL), "--fixed_tokens", "400").wait()
    url = app.url.rstrip("/")
    wav = (ASSETS / "zero_shot_prompt.wav").read_bytes()
    r = httpx.post(f"{url}/api/v1/audio/reference_audio", files={"file": ("p.wav", wav)},
                   data={"text": ZS_TEXT}, timeout=120)
    assert r.status_code == 200, r.text
    yield url, r.json()["id"]
    app.stop()


def pool_state(url: str) -> tuple[float, float]:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    return metric(text, "cosy_workers_busy"), metric(text, "cosy_queue_waiting")


def wait_state(url: str, busy: float, waiting: float, within: float) -> float:
    """Seconds until the pool shows (busy, waiting); fails after `within`."""
    start = time.monotonic()
    while (s := pool_state(url)) != (busy, waiting):
        assert time.monotonic() - start < within, f"pool at {s}, expected {(busy, waiting)} within {within} s"
        time.sleep(0.1)
    return time.monotonic() - start


def pai(ref: str, stream: bool, text: str = LONG) -> dict:
    return {"model": "CosyVoice2-0.5B", "stream": stream,
            "input": {"mode": "fast_replication", "text": text, "reference_audio_id": ref, "output_format": "pcm"}}


class Open:
    """An HTTP request on a raw socket, read in a thread and abandoned at will: `close()` shuts the
    socket down, as a closed browser tab or a killed client does. `first` is set once body bytes arrive."""

    def __init__(self, url: str, path: str, body: dict):
        import json
        from urllib.parse import urlsplit
        host, port = urlsplit(url).hostname, urlsplit(url).port
        data = json.dumps(body).encode()
        self.sock = socket.create_connection((host, port))
        self.sock.sendall(f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
                          f"Content-Length: {len(data)}\r\n\r\n".encode() + data)
        self.first = threading.Event()

        def run():
            got = b""
            try:
                while chunk := self.sock.recv(65536):
                    got += chunk
                    if b"\r\n\r\n" in got and len(got) > got.index(b"\r\n\r\n") + 4:
                        self.first.set()
            except OSError:  # shut down by us
                pass

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()

    def close(self):
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()
        self.thread.join(5)


def _abort(request: Open) -> None:
    request.close()


def test_clients_that_leave_free_workers_and_queue_places_promptly(frontend):
    url, ref = frontend
    assert wait_state(url, 0, 0, 30) >= 0
    # mid-stream (PAI SSE): the worker is busy, the client reads some audio and leaves
    a = Open(url, "/api/v1/audio/speech", pai(ref, True))
    assert a.first.wait(60)
    assert pool_state(url)[0] == 1
    # queued behind it: a non-streaming PAI request and an OpenAI stream, both leave while waiting
    b = Open(url, "/api/v1/audio/speech", pai(ref, False))
    c = Open(url, "/v1/audio/speech", {"model": "m", "input": LONG, "voice": ref, "response_format": "pcm"})
    wait_state(url, 1, 2, 10)
    _abort(b)
    print(f"\nqueued non-streaming left: waiting back in {wait_state(url, 1, 1, LEFT_WITHIN):.2f} s")
    _abort(c)
    print(f"queued OpenAI stream left: waiting back in {wait_state(url, 1, 0, LEFT_WITHIN):.2f} s")
    _abort(a)
    wait_state(url, 0, 0, 120)  # (the mid-stream case is the test below)


def test_clients_that_leave_while_running_free_the_worker_promptly(frontend):
    url, ref = frontend
    wait_state(url, 0, 0, 120)
    a = Open(url, "/api/v1/audio/speech", pai(ref, True))
    assert a.first.wait(60)
    _abort(a)
    print(f"mid-stream client left: busy back in {wait_state(url, 0, 0, LEFT_WITHIN):.2f} s")
    # in the LM, non-streaming: nothing is sent until the end; the client leaves while the worker runs
    d = Open(url, "/api/v1/audio/speech", pai(ref, False))
    wait_state(url, 1, 0, 10)
    time.sleep(1.0)
    _abort(d)
    print(f"non-streaming client left while running: busy back in {wait_state(url, 0, 0, LEFT_WITHIN):.2f} s")
    # OpenAI audio stream left mid-stream
    e = Open(url, "/v1/audio/speech", {"model": "m", "input": LONG, "voice": ref, "response_format": "pcm"})
    assert e.first.wait(60)
    _abort(e)
    print(f"OpenAI mid-stream client left: busy back in {wait_state(url, 0, 0, LEFT_WITHIN):.2f} s")
    # and the server still serves
    r = httpx.post(f"{url}/api/v1/audio/speech", json=pai(ref, False, "你好。"), timeout=120)
    assert r.status_code == 200 and r.json()["output"]["audio"]["data"]


def _process_groups(pid: int) -> set[int]:
    """The process groups of `pid` and everything under it: launch/backend.py starts vLLM's server in a
    session (and group) of its own, so stopping the launcher's group alone would leave vLLM answering."""
    import psutil
    root = psutil.Process(pid)
    groups = set()
    for p in (root, *root.children(recursive=True)):
        try:
            groups.add(os.getpgid(p.pid))
        except ProcessLookupError:
            pass
    return groups


def test_frozen_backend_fails_the_request_within_the_stall_timeout(frontend, backend):
    url, ref = frontend
    assert httpx.get(f"{url}/ready", timeout=10).status_code == 200
    groups = _process_groups(backend.proc.pid)
    assert len(groups) >= 2  # the launcher's and vLLM's
    for g in groups:
        os.killpg(g, signal.SIGSTOP)
    try:
        start = time.monotonic()
        r = httpx.post(f"{url}/api/v1/audio/speech", json=pai(ref, False, "你好。"), timeout=120)
        took = time.monotonic() - start
        print(f"\nfrozen backend: {r.status_code} after {took:.2f} s: {r.text[:200]}")
        assert r.status_code == 503 and "stalled" in r.text and took < STALL + 3
        start = time.monotonic()
        ready = httpx.get(f"{url}/ready", timeout=10)
        assert ready.status_code == 503 and time.monotonic() - start < 1.5  # the pool's verdict, at once
    finally:
        for g in groups:
            os.killpg(g, signal.SIGCONT)
    deadline = time.monotonic() + 30
    while httpx.get(f"{url}/ready", timeout=10).status_code != 200:
        assert time.monotonic() < deadline, "not ready again after SIGCONT"
        time.sleep(0.5)
    r = httpx.post(f"{url}/api/v1/audio/speech", json=pai(ref, False, "你好。"), timeout=120)
    assert r.status_code == 200


class _Frozen:
    """A TCP server that accepts connections and never answers (a frozen backend, without stopping ours)."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", free_port()))
        self.sock.listen(16)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}/v1"

    def close(self):
        self.sock.close()


def test_stalled_backend_fails_over_before_the_first_token(backend):
    from cosy.lm.pool import BackendPool
    from cosy.lm.remote import RemoteLM
    frozen = _Frozen()
    try:
        stalled = RemoteLM(frozen.url, backend.api_key, backend.model_name, stall_timeout=STALL)
        live = RemoteLM(backend.url, backend.api_key, backend.model_name, stall_timeout=STALL)
        pool = BackendPool([stalled, live], cooldown=60)
        start = time.monotonic()
        tokens = list(pool.generate(_embeds(backend), 2, 10, seed=0))
        took = time.monotonic() - start
        assert tokens and STALL - 0.5 < took < STALL + 3, took
        assert "stalled" in pool.errors[id(stalled)] and pool.dead_until[id(stalled)] > time.monotonic()
    finally:
        frozen.close()


def _embeds(backend):
    from cosy.lm.prompt import PromptEmbedder
    return PromptEmbedder.from_model_dir(backend.model_dir)([100, 200], [], [])


def _gradio_call(url: str, name: str, data: list) -> str:
    """POST a raw gradio API call; its event id."""
    r = httpx.post(f"{url}/gradio_api/call/{name}", json={"data": data}, timeout=30)
    assert r.status_code == 200, r.text
    return r.json()["event_id"]


def _gradio_upload(url: str, path: Path) -> dict:
    r = httpx.post(f"{url}/gradio_api/upload", files={"files": (path.name, path.read_bytes())}, timeout=30)
    assert r.status_code == 200, r.text
    return {"path": r.json()[0], "orig_name": path.name, "meta": {"_type": "gradio.FileData"}}


def test_gradio_api_clients_that_leave_free_the_worker_promptly(frontend):
    """A non-generator gradio endpoint keeps running after its client leaves unless it watches its event:
    raw `/gradio_api/call/<name>` calls whose event stream is closed early, while the LM runs."""
    url, ref = frontend
    wav = _gradio_upload(url, ASSETS / "zero_shot_prompt.wav")
    for name, data in (("saved_voice", [LONG, ref, 0, 1.0]),
                       ("zero_shot", [LONG, ZS_TEXT, wav, 0, 1.0])):
        wait_state(url, 0, 0, 120)
        event = _gradio_call(url, name, data)
        with httpx.Client(timeout=60) as client, client.stream("GET", f"{url}/gradio_api/call/{name}/{event}") as r:
            assert r.status_code == 200
            try:
                wait_state(url, 1, 0, 30)
            except AssertionError as e:  # say what the call answered instead of running
                raise AssertionError(f"{e}; the call's events: {r.read().decode()[-1000:]!r}") from None
            time.sleep(0.5)
        print(f"\ngradio {name} client left: busy back in {wait_state(url, 0, 0, LEFT_WITHIN):.2f} s")
    # and the gradio API still answers
    event = _gradio_call(url, "saved_voice", ["你好。", ref, 0, 1.0])
    body = httpx.get(f"{url}/gradio_api/call/saved_voice/{event}", timeout=120).text
    assert "event: complete" in body, body


def test_sigterm_drains_then_ends_open_streams_with_a_clear_error(tiny_model_dir, tmp_path):
    """SIGTERM (an orchestrator's stop): /ready turns 503 at once, new requests get 503, a stream in flight
    past --drain_timeout ends with a ShuttingDown error event (not a cut connection), the process exits 0 and
    leaves nothing half-written in the data dir."""
    data = tmp_path / "data"
    app = App("--model_dir", str(tiny_model_dir), "--data_dir", str(data), "--fixed_tokens", "1500",
              "--drain_timeout", "2").wait()
    url = app.url.rstrip("/")
    r = httpx.post(f"{url}/api/v1/audio/reference_audio", files={"file": ("p.wav", (ASSETS / "zero_shot_prompt.wav")
                                                                           .read_bytes())},
                   data={"text": ZS_TEXT}, timeout=120)
    assert r.status_code == 200, r.text
    body = {"input": {"mode": "fast_replication", "text": LONG, "reference_audio_id": r.json()["id"]},
            "output_format": "pcm"}
    events, sent = [], threading.Event()
    try:
        with httpx.stream("POST", f"{url}/api/v1/audio/speech", json=body, timeout=120) as resp:
            assert resp.status_code == 200
            for line in resp.iter_lines():
                if not line.startswith("data: "):
                    continue
                events.append(json.loads(line[6:]))
                if not sent.is_set():
                    sent.set()
                    app.proc.send_signal(signal.SIGTERM)
                    ready = httpx.get(f"{url}/ready", timeout=5)
                    assert ready.status_code == 503, ready.text  # the reason is in the log, not the answer
                    refused = httpx.post(f"{url}/api/v1/audio/speech", json={**body, "stream": False}, timeout=10)
                    assert refused.status_code == 503 and "shutting down" in refused.text, refused.text
        assert len(events) >= 2
        last = events[-1]
        assert last["output"]["finish_reason"] != "stop", last
        assert "shutting down" in json.dumps(last).lower(), last
        app.proc.wait(20)
    finally:
        if app.proc.poll() is None:
            app.proc.kill()
    assert app.proc.returncode == 0, "".join(app.lines)
    out = "".join(app.lines)
    assert "draining requests in flight" in out and "ended with ShuttingDown" in out, out
    assert "Traceback" not in out, out
    leftovers = [p for p in data.rglob("*")
                 if p.is_file() and (".tmp" in p.name or p.name.startswith(".") and p.name != ".lock")]
    assert leftovers == [], leftovers
