"""Request priorities end to end: the classes and their defaults per surface, what a client may ask for, the
worker queue (by class, then arrival, with aging; a full queue of bulk work still admits a listener; a slot
kept for interactive requests), the workers' flow/HiFT scheduler, and the LM backend's queue (vLLM's priority
scheduling, fed by the client). The real-backend tests are in tests/test_priority_backend.py."""
from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import torch
from conftest import ASSETS
from servers import free_port
from worker_hooks import unhurried_lm

from cosy.deploy.data_dir import DataDir
from cosy.frontend.service import FrontendService, parse_priorities
from cosy.lm.call import current_call, lm_call
from cosy.lm.remote import RemoteLM
from cosy.pipeline.request import PRIORITIES, SynthesisError, SynthesisRequest, default_priority
from cosy.service.job_queue import JobTrace, QueueFull
from cosy.service.workers import EngineSpec, WorkerPool
from cosy.speech.request import LiveRequest
from cosy.speech.scheduler import SpeechScheduler

ZS_WAV = str(ASSETS / "zero_shot_prompt.wav")
ZS_TEXT = "希望你以后能够做的比我还好呦。"
LONG = "今天天气很好，我们一起去公园散步，看看花草树木。" * 3
TOKENS = 120  # per request (--fixed_tokens), at `unhurried_lm`'s pace: seconds of wall time at little CPU


def request(**kw) -> SynthesisRequest:
    base = dict(mode="zero_shot", text="你好。", prompt_text=ZS_TEXT, prompt_wav=ZS_WAV, seed=1)
    return SynthesisRequest(**{**base, **kw})


# ---------------------------------------------------------------------------------------- classes and rules

@pytest.mark.quick
def test_each_surface_has_its_default_class():
    assert PRIORITIES == ("interactive", "default", "bulk")
    assert default_priority("pai", stream=True) == "interactive"  # streams, the WebSocket sessions too
    assert default_priority("openai", stream=False) == "default"  # a whole file
    assert default_priority("webui", stream=True) == "interactive"
    assert default_priority("gradio_api", stream=False) == "default"
    assert default_priority("batch", stream=False) == "bulk"


@pytest.mark.quick
def test_a_client_may_lower_its_class_and_raise_it_only_where_allowed(tiny_model_dir, tmp_path):
    service = FrontendService(WorkerPool(EngineSpec(str(tiny_model_dir))), DataDir(tmp_path))  # not started
    assert service.priority_of(request(stream=True), "pai") == "interactive"
    assert service.priority_of(request(stream=True, priority="bulk"), "pai") == "bulk"
    assert service.priority_of(request(priority="default"), "openai") == "default"
    with pytest.raises(SynthesisError, match=r"priority 'interactive' is more urgent than this request's default "
                                             r"\('default'\).*--allow_priority.*choose one of default, bulk"):
        service.priority_of(request(priority="interactive"), "openai")
    with pytest.raises(SynthesisError, match="choose one of bulk, or leave priority out"):
        service.priority_of(request(priority="default"), "batch")
    service.allow_priority = parse_priorities("interactive")
    assert service.priority_of(request(priority="interactive"), "openai") == "interactive"
    with pytest.raises(ValueError, match="unknown class 'urgent'"):
        parse_priorities("interactive,urgent")
    with pytest.raises(SynthesisError, match="priority must be one of interactive, default, bulk"):
        request(priority="urgent").check()


@pytest.mark.quick
def test_each_class_is_sent_to_vllm_as_its_priority_lower_first():
    assert current_call() is None
    seen = {}
    for name in PRIORITIES:
        with lm_call(name) as call:
            assert current_call() is call
            seen[name] = call.vllm_priority
    assert seen == {"interactive": -1, "default": 0, "bulk": 1} and current_call() is None


# ---------------------------------------------------------------------------------------- the speech scheduler

@pytest.mark.quick
def test_the_flow_scheduler_runs_a_listeners_later_chunk_before_an_earlier_bulk_requests_first_one():
    """Without classes a first chunk (or a whole utterance) goes before any later chunk: a bulk file's flow
    would cut in front of a stream already playing."""
    sched = SpeechScheduler(starve_after=30.0)
    order, busy, release = [], threading.Event(), threading.Event()

    def blocker() -> None:
        busy.set()
        release.wait(10)

    def item(request: LiveRequest, first: bool, name: str) -> None:
        sched.bind(request)
        sched.run(first, lambda: order.append(name))

    listener = LiveRequest(1, "synthesize", {"priority": "interactive"})
    bulk = LiveRequest(2, "synthesize", {"priority": "bulk"})  # arrived after the listener, before its chunk
    threading.Thread(target=lambda: (sched.bind(LiveRequest(0, "synthesize", {})), sched.run(True, blocker)),
                     daemon=True).start()
    assert busy.wait(10)
    threads = [threading.Thread(target=item, args=(bulk, True, "bulk's whole file")),
               threading.Thread(target=item, args=(listener, False, "listener's third chunk"))]
    for t in threads:
        t.start()
        time.sleep(0.2)  # queued in this order
    release.set()
    for t in threads:
        t.join(10)
    sched.close()
    assert order == ["listener's third chunk", "bulk's whole file"]


@pytest.mark.quick
def test_a_bulk_item_moves_up_a_class_every_aging_seconds_and_then_goes_first():
    sched = SpeechScheduler(starve_after=0.3, aging=0.25)
    order, busy, release = [], threading.Event(), threading.Event()

    def hold() -> None:
        busy.set()
        release.wait(10)

    threading.Thread(target=lambda: (sched.bind(LiveRequest(0, "synthesize", {})), sched.run(True, hold)),
                     daemon=True).start()
    assert busy.wait(10)

    def item(request: LiveRequest, name: str) -> None:
        sched.bind(request)
        sched.run(True, lambda: order.append(name))

    old = threading.Thread(target=item, args=(LiveRequest(2, "synthesize", {"priority": "bulk"}), "bulk"))
    old.start()
    time.sleep(0.6)  # two classes up: it competes as interactive now, and arrived first
    new = threading.Thread(target=item, args=(LiveRequest(3, "synthesize", {"priority": "interactive"}), "listener"))
    new.start()
    time.sleep(0.2)
    release.set()
    old.join(10)
    new.join(10)
    sched.close()
    assert order == ["bulk", "listener"]


@pytest.mark.quick
def test_bulk_work_waits_while_a_listener_awaits_its_first_packet_and_runs_when_the_hold_ends():
    """A listener whose LM is still making its first tokens holds back bulk flows (the cores go to its LM);
    its first packet's items then run before the bulk work queued earlier, which waits until that packet is sent,
    also while the listener's thread waits for tokens between them. A listener that never gets a chunk holds
    nothing past `hold_first`."""
    sched = SpeechScheduler(starve_after=30.0, hold_first=60.0)
    order, bulk_queued = [], threading.Event()
    listener = LiveRequest(1, "synthesize", {"priority": "interactive", "stream": True})
    bulk = LiveRequest(2, "synthesize", {"priority": "bulk"})
    sched.bind(listener)  # (in its own thread in a worker; binding registers it as waiting)

    def bulk_item() -> None:
        sched.bind(bulk)
        bulk_queued.set()
        sched.run(True, lambda: order.append("bulk"))

    t = threading.Thread(target=bulk_item)
    t.start()
    assert bulk_queued.wait(10)
    deadline = time.monotonic() + 10
    while sched.pending() == 0 and time.monotonic() < deadline:  # the bulk item is queued, not run
        time.sleep(0.01)
    time.sleep(0.3)
    assert order == [] and sched.pending() == 1, "bulk work started while a listener waited for its first packet"
    sched.run(True, lambda: order.append("listener ahead"))  # the first chunk's prompt part
    time.sleep(0.3)  # its thread waits for more tokens: the hold goes on until the first packet is out
    assert order == ["listener ahead"] and sched.pending() == 1, "bulk work started between a listener's items"
    sched.run(True, lambda: order.append("listener chunk"))  # the first chunk
    sched.heard(listener)  # the worker sent it
    t.join(10)
    assert order == ["listener ahead", "listener chunk", "bulk"]
    sched.close()

    short = SpeechScheduler(starve_after=30.0, hold_first=0.3)
    short.bind(LiveRequest(3, "synthesize", {"priority": "interactive", "stream": True}))  # never makes a chunk
    short.bind(LiveRequest(4, "synthesize", {"priority": "bulk"}))
    done = []
    short.run(True, lambda: done.append("bulk"))  # returns once the hold has ended
    short.close()
    assert done == ["bulk"]


@pytest.mark.quick
def test_a_duplex_session_holds_bulk_work_only_once_its_text_has_come():
    """A WebSocket session that sends no text has nothing to say yet: it holds nothing (a client opening
    sessions without text cannot stall the bulk work). Its first text piece starts its hold."""
    sched = SpeechScheduler(starve_after=30.0, hold_first=60.0)
    session = LiveRequest(1, "duplex", {"priority": "interactive"})
    sched.bind(session)
    done = []

    def bulk_item(n: int) -> None:
        sched.bind(LiveRequest(10 + n, "synthesize", {"priority": "bulk"}))
        sched.run(True, lambda: done.append(n))

    t = threading.Thread(target=bulk_item, args=(1,))
    t.start()
    t.join(5)
    assert done == [1], "bulk work waited for a session that has sent no text"
    session.text.put("你好。")
    assert next(session.pieces()) == "你好。"  # the worker reads its first text: the session waits for audio now
    t = threading.Thread(target=bulk_item, args=(2,))
    t.start()
    time.sleep(0.3)
    assert done == [1] and sched.pending() == 1, "bulk work ran while a speaking session waited for its first packet"
    sched.heard(session)
    t.join(10)
    assert done == [1, 2]
    sched.close()


# ---------------------------------------------------------------------------------------- the LM client

class _NoPriorities(BaseHTTPRequestHandler):
    """A completions server without per-request priorities: 400 for a body with `priority`, else a stream of
    one token and a stop. The bodies it got are in `bodies`."""

    bodies: list[dict] = []

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).bodies.append(body)
        if "priority" in body:
            data = json.dumps({"error": {"message": "priority is not supported: this server does not use "
                                                    "priority scheduling", "code": 400}}).encode()
            self.send_response(400)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        for ids, finish in (([7], None), ([6561], "stop")):
            chunk = {"id": "c", "object": "text_completion", "created": 0, "model": body["model"],
                     "choices": [{"index": 0, "text": "", "token_ids": ids, "finish_reason": finish}]}
            self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
        self.wfile.write(b"data: [DONE]\n\n")

    def log_message(self, *args):
        pass


@pytest.mark.quick
def test_the_client_asks_again_without_priority_where_a_server_refuses_it_and_never_sends_it_again():
    server = ThreadingHTTPServer(("127.0.0.1", free_port()), _NoPriorities)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        lm = RemoteLM(f"http://127.0.0.1:{server.server_port}/v1", "k", "m", retries=0)
        x = torch.zeros(1, 3, 8)
        with lm_call("bulk") as call:
            assert list(lm.generate(x, 0, 10, seed=1)) == [7]
            assert list(lm.generate(x, 0, 10, seed=1)) == [7]
        with lm_call("default"):  # vLLM's own default: no field at all
            assert list(lm.generate(x, 0, 10, seed=1)) == [7]
        assert [b.get("priority") for b in _NoPriorities.bodies] == [1, None, None, None]
        assert not lm.send_priority and call.backend_seconds > 0
    finally:
        server.shutdown()


# ---------------------------------------------------------------------------------------- the worker queue

def _pool(tiny_model_dir, **kw) -> WorkerPool:
    spec = EngineSpec(str(tiny_model_dir), fixed_tokens=TOKENS, max_batch=kw.pop("max_batch", 1))
    pool = WorkerPool(spec, workers=1, **kw)
    pool.worker_prepare = unhurried_lm
    return pool.start()


class Reader(threading.Thread):
    """Reads one synthesis from the pool in the background: `.first` (time of its first chunk), `.done`."""

    def __init__(self, pool: WorkerPool, req: SynthesisRequest):
        super().__init__(daemon=True)
        self.pool, self.req, self.trace = pool, req, JobTrace()
        self.first = self.done = None
        self.error: BaseException | None = None
        self.started = threading.Event()
        self.stop = threading.Event()
        self.start()

    def run(self) -> None:
        chunks = self.pool.synthesize(self.req, self.stop, self.trace)
        try:
            for _ in chunks:
                if self.first is None:
                    self.first = time.monotonic()
                    self.started.set()
            self.done = time.monotonic()
        except BaseException as e:  # noqa: BLE001 -- the test reads it
            self.error = e
        finally:
            self.started.set()
            chunks.close()


def _until(condition, within: float = 60.0) -> None:
    deadline = time.monotonic() + within
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


@pytest.fixture(scope="module")
def pool(tiny_model_dir):
    p = _pool(tiny_model_dir, max_queue=2, aging=600.0)
    yield p
    p.close()


def test_the_queue_serves_a_later_interactive_request_before_an_earlier_bulk_one(pool):
    blocker = Reader(pool, request(text=LONG, stream=True))  # default class: holds the one slot
    assert blocker.started.wait(120) and blocker.error is None
    bulk = Reader(pool, request(priority="bulk"))
    _until(lambda: pool.stats()["waiting"] == 1)
    listener = Reader(pool, request(stream=True, priority="interactive"))
    _until(lambda: pool.stats()["waiting_by_priority"] == {"interactive": 1, "default": 0, "bulk": 1})
    blocker.stop.set()  # its caller left: the slot is free
    for r in (listener, bulk):
        r.join(120)
        assert r.error is None and r.done is not None
    assert listener.done < bulk.first  # one slot: the listener's whole stream, then the bulk file
    assert listener.trace.queue_wait < bulk.trace.queue_wait


def test_a_queue_full_of_bulk_work_still_admits_a_listener(pool):
    blocker = Reader(pool, request(text=LONG, stream=True))
    assert blocker.started.wait(120)
    waiting = [pool.submit("synthesize", request(priority="bulk").to_wire()) for _ in range(2)]  # max_queue 2
    with pytest.raises(QueueFull, match=r"\(2 requests waiting\)"):
        pool.submit("synthesize", request(priority="bulk").to_wire())
    listener = pool.submit("synthesize", request(stream=True, priority="interactive").to_wire())  # admitted
    for job in [*waiting, listener]:
        pool.cancel(job)
    blocker.stop.set()
    blocker.join(60)


def test_aging_moves_a_waiting_bulk_request_up_a_class_every_aging_seconds(tiny_model_dir):
    pool = _pool(tiny_model_dir, aging=1.0)
    try:
        blocker = Reader(pool, request(text=LONG, stream=True))
        assert blocker.started.wait(120)
        bulk = Reader(pool, request(priority="bulk"))
        time.sleep(2.5)  # two classes up: it competes as interactive, and arrived first
        listener = Reader(pool, request(stream=True, priority="interactive"))
        _until(lambda: pool.stats()["waiting"] == 2)
        blocker.stop.set()
        for r in (bulk, listener):
            r.join(120)
            assert r.error is None
        assert bulk.done < listener.first
    finally:
        pool.close()


def test_a_worker_keeps_its_last_slot_for_a_listener_and_priorities_off_is_one_fifo_queue(tiny_model_dir):
    pool = _pool(tiny_model_dir, max_batch=2)
    try:
        # the pool has had a listener: from now on it keeps a slot for one
        Reader(pool, request(stream=True, priority="interactive")).join(120)
        bulk = [Reader(pool, request(text=LONG, priority="bulk")) for _ in range(2)]
        _until(lambda: pool.stats()["busy"] == 1 and pool.stats()["waiting"] == 1)
        time.sleep(1.0)
        assert pool.stats()["busy"] == 1  # the second bulk request waits beside the free slot
        listener = Reader(pool, request(stream=True, priority="interactive"))
        assert listener.started.wait(60) and listener.error is None
        assert pool.stats()["waiting"] == 1  # started beside the bulk one, ahead of the other
        for r in bulk:
            r.stop.set()
        listener.join(60)
    finally:
        pool.close()
    fifo = _pool(tiny_model_dir, max_batch=1, priorities=False)
    try:
        blocker = Reader(fifo, request(text=LONG, stream=True))
        assert blocker.started.wait(120)
        bulk = Reader(fifo, request(priority="bulk"))
        _until(lambda: fifo.stats()["waiting"] == 1)
        listener = Reader(fifo, request(stream=True, priority="interactive"))
        _until(lambda: fifo.stats()["waiting"] == 2)
        blocker.stop.set()
        for r in (bulk, listener):
            r.join(120)
            assert r.error is None
        assert bulk.done < listener.first  # first come, first served
    finally:
        fifo.close()
