"""A real HTTP stack for the API tests: two uvicorn apps (one open, one keyed) over one FrontendService,
a real WorkerPool on the tiny model and a real DataDir, with Gradio mounted at "/" after `install` (as
`build_app` does). Import `stack` into a test module to get a module-scoped instance."""
from __future__ import annotations

import faulthandler
import io
import os
import socket
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import av
import httpx
import openai
import pytest
import soundfile as sf
from conftest import ASSETS

from cosy.deploy.data_dir import DataDir
from cosy.frontend.service import FrontendService
from cosy.service.process import DUMP
from cosy.service.workers import EngineSpec, WorkerPool

ZS_WAV = ASSETS / "zero_shot_prompt.wav"
ZS_TEXT = "希望你以后能够做的比我还好呦。"
SHORT = "你好，世界。"
MEDIUM = "今天天气很好，我们一起去公园散步。"  # three streaming chunks
LONG = "今天天气很好，我们一起去公园散步，看看花草树木。" * 2
KEY = "s3cret-key"
RATE = 24000


def _app(service, api_key, ready):
    import gradio as gr
    from fastapi import FastAPI

    from cosy.frontend.http_api import install

    app = FastAPI()
    with gr.Blocks() as blocks:
        gr.Markdown("cosy test page")
    install(app, service, api_key=api_key, ready=ready)
    return gr.mount_gradio_app(app, blocks, path="/")


def _serve(app):
    import uvicorn

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.05)
    return server, thread, f"http://127.0.0.1:{sock.getsockname()[1]}"


@pytest.fixture(scope="module")
def stack(tiny_model_dir, tmp_path_factory):
    pool = WorkerPool(EngineSpec(str(tiny_model_dir)), workers=1, max_queue=8)
    pool.cancel_grace = 20.0  # a worker stuck on a cancel: its stacks in the failing test's output, then a new one
    pool.start()
    data = DataDir(tmp_path_factory.mktemp("data"))
    service = FrontendService(pool, data)
    state = {"ready": (True, "models loaded")}
    servers = [_serve(_app(service, None, lambda: state["ready"])),
               _serve(_app(service, KEY, lambda: (True, "ok")))]
    url, keyed = servers[0][2], servers[1][2]
    r = httpx.post(f"{url}/api/v1/audio/reference_audio", files={"file": ("prompt.wav", ZS_WAV.read_bytes())},
                   data={"text": ZS_TEXT}, timeout=60)
    assert r.status_code == 200, r.text
    yield SimpleNamespace(url=url, keyed=keyed, pool=pool, service=service, data=data, state=state,
                          ref=r.json()["id"], client=openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0,
                                                                timeout=120))
    for server, thread, _ in servers:
        server.should_exit = True
        thread.join(10)
    pool.close()


def wait_idle(pool: WorkerPool, within: float) -> float:
    """Seconds until no worker holds a job; past `within`, every thread of this process and of the workers
    writes its stack to stderr (the failing test's output: where it hangs), and the test fails."""
    start = time.monotonic()
    while pool.stats()["busy"]:
        if time.monotonic() - start > within:
            faulthandler.dump_traceback(all_threads=True)
            for proc in pool._procs:
                if proc.is_alive():
                    os.kill(proc.pid, DUMP)
            time.sleep(1.0)
            raise AssertionError(f"a worker still holds a job after {within} s (stacks on stderr)")
        time.sleep(0.02)
    return time.monotonic() - start


def _error(r: httpx.Response, status: int, type_: str, *words: str) -> dict:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["code"] == status and err["type"] == type_, err
    for w in words:
        assert w in err["message"], err["message"]
    return err


def _decode(fmt: str, data: bytes) -> tuple[int, int]:
    """(samples, rate) by decoders other than our encoders: libsndfile, and ffmpeg's decoder for aac."""
    if fmt == "pcm":
        return len(data) // 2, RATE
    if fmt == "aac":
        with av.open(io.BytesIO(data)) as c:
            frames = list(c.decode(audio=0))
        return sum(f.samples for f in frames), frames[0].sample_rate
    audio, rate = sf.read(io.BytesIO(data))
    return len(audio), rate


def _tree(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


# --- OpenAI-compatible ---------------------------------------------------------------------------------------


def _pai(stack, **kw):
    body = {"model": "CosyVoice2-0.5B", "input": {"mode": "fast_replication", "text": SHORT,
                                                  "reference_audio_id": stack.ref}, "seed": 5, **kw}
    return httpx.post(f"{stack.url}/api/v1/audio/speech", json=body, timeout=120)
