"""Priorities against a real vLLM backend (`launch/backend.py`: --scheduling-policy priority), run with one
sequence at a time (--max_num_seqs 1) so that requests queue inside vLLM: the LM client's priority orders
vLLM's queue, and through the real frontend (`app.py` with one worker slot) a listener's stream that arrives
after a bulk file is served before it. The frontend's /metrics then has the backend's share of each request."""
from __future__ import annotations

import base64
import json
import threading
import time

import httpx
import pytest
from conftest import ASSETS
from servers import Backend, metric, start_apps

from cosy.lm.call import lm_call
from cosy.lm.remote import RemoteLM
from cosy.lm.sampling import SamplingParams

ZS_WAV = ASSETS / "zero_shot_prompt.wav"
ZS_TEXT = "希望你以后能够做的比我还好呦。"
LONG = "今天天气很好，我们一起去公园散步，看看花草树木，听听鸟儿唱歌。" * 4


@pytest.fixture(scope="module")
def one_seq_backend(tiny_model_dir, tmp_path_factory):
    folder = tmp_path_factory.mktemp("one_seq_backend")
    b = Backend(tiny_model_dir, folder / "cache", folder / "backend.log", extra=("--max_num_seqs", "1"))
    try:
        b.start()
        yield b
    finally:
        b.stop()


def _until(condition, within: float = 120.0, what: str = "") -> None:
    deadline = time.monotonic() + within
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def _vllm_waiting(backend: Backend) -> float:
    """Requests waiting in vLLM's queue (its own /metrics)."""
    text = httpx.get(backend.url.removesuffix("/v1") + "/metrics", timeout=10).text
    return metric(text, "vllm:num_requests_waiting")


def test_vllm_serves_a_later_interactive_request_before_an_earlier_bulk_one(one_seq_backend, tiny_model_dir):
    from cosy.lm.prompt import PromptEmbedder
    x = PromptEmbedder.from_model_dir(tiny_model_dir)([100, 200, 300], [7, 8], [11, 12, 13])
    lm = RemoteLM(one_seq_backend.url, one_seq_backend.api_key, one_seq_backend.model_name)
    first: dict[str, float] = {}
    leave = threading.Event()
    errors: list[BaseException] = []

    def run(name: str, priority: str, tokens: int) -> None:
        try:
            with lm_call(priority):
                stream = lm.complete(x, tokens, params=SamplingParams(ignore_stop=True), seed=1)
                for _ in stream:
                    first.setdefault(name, time.monotonic())
                    if leave.is_set() and name == "blocker":
                        break  # closing the stream aborts it: the one sequence is free
                stream.close()
        except BaseException as e:  # noqa: BLE001 -- re-raised by the test
            errors.append(e)

    threads = {"blocker": threading.Thread(target=run, args=("blocker", "default", 20000))}
    threads["blocker"].start()
    _until(lambda: "blocker" in first or errors, what="the blocker's first token")
    threads["bulk"] = threading.Thread(target=run, args=("bulk", "bulk", 20))
    threads["bulk"].start()
    _until(lambda: _vllm_waiting(one_seq_backend) == 1, what="the bulk request queued in vLLM")
    threads["interactive"] = threading.Thread(target=run, args=("interactive", "interactive", 20))
    threads["interactive"].start()
    _until(lambda: _vllm_waiting(one_seq_backend) == 2, what="both queued in vLLM")
    leave.set()
    for t in threads.values():
        t.join(120)
    assert not errors, errors
    assert first["interactive"] < first["bulk"], "vLLM served the earlier bulk request first"


def _upload(url: str) -> str:
    r = httpx.post(f"{url}api/v1/audio/reference_audio", files={"file": ("p.wav", ZS_WAV.read_bytes())},
                   data={"text": ZS_TEXT}, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()["id"]


class Speech(threading.Thread):
    """One PAI synthesis in the background: `.first` (first audio event), `.done`, `.error`; `.leave()`."""

    def __init__(self, url: str, ref: str, text: str, stream: bool, priority: str | None = None):
        super().__init__(daemon=True)
        self.url, self.stream = url, stream
        self.body = {"input": {"mode": "fast_replication", "text": text, "reference_audio_id": ref,
                               "output_format": "pcm"}, "stream": stream}
        if priority is not None:
            self.body["input"]["priority"] = priority
        self.first = self.done = self.error = None
        self.audio = 0
        self.started, self.left = threading.Event(), threading.Event()
        self.start()

    def leave(self) -> None:
        self.left.set()
        self.join(60)

    def run(self) -> None:
        try:
            with httpx.stream("POST", f"{self.url}api/v1/audio/speech", json=self.body, timeout=600) as r:
                if r.status_code != 200:
                    self.error = f"{r.status_code}: {r.read()[:300]!r}"
                    return
                lines = r.iter_lines() if self.stream else [f"data:{r.read().decode()}"]
                for line in lines:
                    if not line.startswith("data:"):
                        continue
                    event = json.loads(line[5:])
                    self.audio += len(base64.b64decode(event["output"]["audio"]["data"] or ""))
                    if self.first is None:
                        self.first = time.monotonic()
                        self.started.set()
                    if self.left.is_set():
                        return
            self.done = time.monotonic()
        except httpx.HTTPError as e:
            self.error = e
        finally:
            self.started.set()


def test_through_the_frontend_a_later_listener_is_served_before_an_earlier_bulk_file(one_seq_backend,
                                                                                     tiny_model_dir, tmp_path):
    """One worker slot (--workers 1 --max_batch 1): a stream holds it; a bulk file arrives, then a listener's
    stream; when the slot frees, the listener's whole stream is served before the bulk file starts."""
    (app,) = start_apps(["--model_dir", str(tiny_model_dir), "--data_dir", str(tmp_path), "--llm_base_url",
                         one_seq_backend.url, "--llm_api_key", one_seq_backend.api_key, "--workers", "1",
                         "--max_batch", "1"])
    try:
        ref = _upload(app.url)

        def waiting() -> float:
            return metric(httpx.get(f"{app.url}metrics", timeout=10).text, "cosy_queue_waiting")

        blocker = Speech(app.url, ref, LONG, stream=True)
        assert blocker.started.wait(300) and blocker.error is None, blocker.error
        bulk = Speech(app.url, ref, "你好，欢迎使用。", stream=False, priority="bulk")
        _until(lambda: waiting() == 1, what="the bulk file queued")
        listener = Speech(app.url, ref, "你好，欢迎使用。", stream=True)  # a stream: interactive by default
        _until(lambda: waiting() == 2, what="the listener queued")
        blocker.leave()  # its client left: the slot is free
        for s in (listener, bulk):
            s.join(300)
            assert s.error is None and s.done is not None and s.audio > 0, s.error
        assert listener.done < bulk.done, "the earlier bulk file was served before the later listener"
        text = httpx.get(f"{app.url}metrics", timeout=10).text
        assert metric(text, "cosy_queue_wait_seconds_count", priority="bulk", api="pai") == 1
        assert metric(text, "cosy_stream_first_packet_seconds_count", priority="interactive", api="pai") >= 2
        assert metric(text, "cosy_backend_share_count", priority="interactive", api="pai") == 1  # the blocker left
        assert 0 < metric(text, "cosy_backend_share_sum", priority="bulk", api="pai") <= 1
    finally:
        app.stop()
