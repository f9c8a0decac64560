"""vLLM's router (the `vllm-router` package, Rust) in front of two real backends, with a real frontend behind it:
prompt-embeds completions stream through it, the frontend's served-model check works through it, requests
reach both backends (round robin), and with one backend killed every request still succeeds."""
from __future__ import annotations

import dataclasses
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from conftest import ASSETS, launched_backend
from servers import App, Backend, free_port, metric

from cosy.lm.prompt import PromptEmbedder
from cosy.lm.remote import BackendError, RemoteLM

ROUTER = Path(sys.executable).parent / "vllm-router"
TEXT = "今天天气很好，我们一起去公园散步吧。"
ZS_TEXT = "希望你以后能够做的比我还好呦。"


@pytest.fixture(scope="module")
def second_backend(request):
    """Another backend on the tiny model (launched with the session's: conftest.SHARED_BACKENDS)."""
    with launched_backend(request, "second_backend") as b:
        yield b


@pytest.fixture(scope="module")
def router(backend, second_backend, tmp_path_factory):
    """`vllm-router` on round robin over both backends; its URL (no /v1)."""
    port = free_port()
    log = tmp_path_factory.mktemp("router") / "router.log"
    workers = [b.url.removesuffix("/v1") for b in (backend, second_backend)]
    with open(log, "wb") as out:
        proc = subprocess.Popen([str(ROUTER), "--host", "127.0.0.1", "--port", str(port), "--worker-urls", *workers,
                                 "--policy", "round_robin", "--health-check-interval-secs", "1",
                                 "--prometheus-port", str(free_port())], stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                break
        except httpx.TransportError:
            pass
        assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
        time.sleep(0.5)
    yield url
    proc.terminate()
    proc.wait(10)


@pytest.fixture(scope="module")
def frontend(router, backend, tiny_model_dir, tmp_path_factory):
    app = App("--model_dir", str(tiny_model_dir), "--data_dir", str(tmp_path_factory.mktemp("router_data")),
              "--llm_base_url", f"{router}/v1", "--llm_api_key", backend.api_key)
    try:
        yield app.wait().url.rstrip("/")
    finally:
        app.stop()


def served(b: Backend) -> float:
    """Completions the backend has finished (vLLM's own /metrics)."""
    return metric(httpx.get(b.url.removesuffix("/v1") + "/metrics", timeout=10).text, "vllm:request_success_total")


def reference(frontend: str) -> str:
    with open(ASSETS / "zero_shot_prompt.wav", "rb") as f:
        r = httpx.post(f"{frontend}/api/v1/audio/reference_audio", files={"file": ("p.wav", f)},
                       data={"text": ZS_TEXT}, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()["id"]


def speak(frontend: str, voice: str, seed: int) -> bytes:
    r = httpx.post(f"{frontend}/v1/audio/speech", json={"model": "CosyVoice2-0.5B", "voice": voice, "input": TEXT,
                                                        "response_format": "wav", "seed": seed}, timeout=300)
    assert r.status_code == 200 and r.content[:4] == b"RIFF" and len(r.content) > 24000, r.text[:500]
    return r.content


def test_model_check_and_streaming_through_the_router(router, backend):
    lm = RemoteLM(f"{router}/v1", backend.api_key, backend.model_name)
    lm.check()  # /v1/models answered by a backend through the router
    with pytest.raises(BackendError, match=f"serves {backend.model_name}, but this frontend's llm.pt is"):
        RemoteLM(f"{router}/v1", backend.api_key, "cosyvoice2-0123456789abcdef").check()
    with pytest.raises(BackendError, match="refused the API key"):  # the router passes the key through
        RemoteLM(f"{router}/v1", "wrong-key", backend.model_name).check()
    embeds = PromptEmbedder.from_model_dir(backend.model_dir)([5, 6, 7, 8], [], [1, 2, 3])
    direct = RemoteLM(backend.url, backend.api_key, backend.model_name)
    greedy = dataclasses.replace(lm.sampling, greedy=True)
    got = list(lm.generate(embeds, 12, 12, seed=3, params=greedy))  # streamed through the router
    assert len(got) == 12 and got == list(direct.generate(embeds, 12, 12, seed=3, params=greedy))


def test_frontend_behind_the_router_uses_both_backends_and_survives_one_killed(frontend, backend, second_backend):
    voice = reference(frontend)
    before = served(backend), served(second_backend)
    for seed in range(4):
        speak(frontend, voice, seed)
    after = served(backend), served(second_backend)
    assert after[0] > before[0] and after[1] > before[1], (before, after)  # round robin reached both
    second_backend.crash()
    for seed in range(4, 8):  # the router routes around the dead backend (retry, then its health check)
        speak(frontend, voice, seed)
    assert httpx.get(f"{frontend}/ready", timeout=10).status_code == 200
