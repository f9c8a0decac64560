"""The deployment as users run it: one vLLM backend, two frontends (`app.py --llm_base_url`) on one data dir.

Readiness follows the backend without restarting frontends; a reference audio made on one frontend is used
from the other; a bounded load test (32 concurrent streaming requests, loopback only) completes every
response and prints first-packet p50/p95 and RTF.
"""
from __future__ import annotations

import base64
import json
import statistics
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest
from conftest import ASSETS
from servers import start_apps

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
