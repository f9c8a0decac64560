"""The duplex WebSocket task protocol against a real frontend (tests/http_stack.py: uvicorn + a real worker pool
on the tiny model, embedded LM), with real `websockets` clients."""
from __future__ import annotations

import asyncio
import base64
import io
import json
import re
import time
import uuid

import pytest
import soundfile as sf
import websockets
from dashscope_client import dashscope_task
from http_stack import KEY

RATE = 24000
# ten two-token pieces: cross-lingual decoding (no prompt speech to place first) makes 15 speech tokens per 5
# text tokens while the text streams: 60 before the text ends, enough for the first audio chunk (<= 52)
PIECES = [" one two", " three four", " five six", " seven eight", " nine ten", " red green", " blue black",
          " cat dog", " sun moon", " up down"]
LONG_TEXT = "今天天气很好，我们一起去公园散步，看看花草树木，听听鸟儿唱歌。" * 3
SHORT_PIECES = ["one", " two", " three", " four", " five", " six"]


def ws_url(stack, path="/api-ws/v1/audio/speech", keyed=False):
    return (stack.keyed if keyed else stack.url).replace("http://", "ws://") + path


def run_task(task_id, ref, **params):
    parameters = {"mode": "cross_lingual_replication", "reference_audio_id": ref, "output_format": "wav",
                  "sample_rate": RATE, "seed": 3, **params}
    return json.dumps({"header": {"action": "run-task", "task_id": task_id, "streaming": "duplex"},
                       "payload": {"task_group": "audio", "task": "tts", "function": "SpeechSynthesizer",
                                   "model": "cosyvoice-v2", "parameters": parameters, "input": {}}})


def action(name, task_id, text=None):
    payload = {"input": {"text": text}} if text is not None else {"input": {}}
    return json.dumps({"header": {"action": name, "task_id": task_id, "streaming": "duplex"}, "payload": payload})


async def one_task(ws, ref, pieces=PIECES, delay=0.3, **params):
    """Run a task; (events, audio bytes, index of the first audio event among all received, pieces sent then)."""
    task_id = str(uuid.uuid4())
    await ws.send(run_task(task_id, ref, **params))
    started = json.loads(await ws.recv())
    assert started["header"] == {"event": "task-started", "task_id": task_id, "attributes": {}}
    events, audio, first_audio_after = [], bytearray(), None
    sent = 0

    async def receive():
        nonlocal first_audio_after
        while True:
            msg = await ws.recv()
            if isinstance(msg, bytes):
                audio.extend(msg)
                continue
            e = json.loads(msg)
            events.append(e)
            if e["header"]["event"] == "result-generated":
                if "audio" in e["payload"]["output"]:
                    audio.extend(base64.b64decode(e["payload"]["output"]["audio"]["data"]))
                if first_audio_after is None:
                    first_audio_after = sent
            if e["header"]["event"] in ("task-finished", "task-failed"):
                return

    reader = asyncio.create_task(receive())
    for piece in pieces:
        await ws.send(action("continue-task", task_id, piece))
        sent += 1
        await asyncio.sleep(delay)
    for _ in range(1200):  # up to 4 minutes for the text phase's first audio (a loaded CPU is slow)
        if first_audio_after is not None or reader.done() or pieces is not PIECES:
            break
        await asyncio.sleep(0.2)
    finished_sent = first_audio_after
    await ws.send(action("finish-task", task_id))
    await asyncio.wait_for(reader, 300)
    return task_id, events, bytes(audio), finished_sent


@pytest.fixture
def patient(stack):
    """The first audio needs 52 speech tokens through flow/HiFT: on a loaded CPU that can take a minute."""
    stack.service.ws_idle_timeout = 600.0
    yield stack
    stack.service.ws_idle_timeout = 60.0


def test_pai_duplex_two_tasks_on_one_connection(stack, patient):
    async def main():
        async with websockets.connect(ws_url(stack), max_size=None) as ws:
            results = [await one_task(ws, stack.ref),
                       await one_task(ws, stack.ref, SHORT_PIECES, 0.05, binary_audio=True)]
            await ws.send(action("continue-task", results[0][0], "late"))  # the connection is still usable
            late = json.loads(await ws.recv())
        return results, late

    results, late = asyncio.run(main())
    for (task_id, events, audio, first_audio_after), pieces in zip(results, (PIECES, SHORT_PIECES)):
        kinds = [e["header"]["event"] for e in events]
        assert kinds[-1] == "task-finished" and set(kinds[:-1]) == {"result-generated"}, kinds
        if pieces is PIECES:  # the first audio came before finish-task, while text was still streaming in
            assert first_audio_after is not None and first_audio_after <= len(PIECES)
        for e in events[:-1]:
            m = e["payload"]["metrics"]
            assert m["speech_len"] > 0 and m["server_cost_time"] > 0 and m["generate_time"] >= 0
        assert events[-1]["payload"]["usage"] == {"characters": sum(map(len, pieces))}
        wav, rate = sf.read(io.BytesIO(audio))
        assert rate == RATE
        total = sum(e["payload"]["metrics"]["speech_len"] for e in events[:-1])
        assert abs(len(wav) / RATE - total) < 0.01
        # 25 speech tokens a second: at least the text phase's (15 per 5 text tokens)
        assert len(wav) / RATE >= 15 * (sum(len(p.split()) for p in pieces) // 5) / 25
    assert late["header"]["event"] == "task-failed" and late["header"]["error_code"] == "InvalidTask"


@pytest.mark.parametrize("send, code, words", [
    (b"\x00\x01", "InvalidMessage", "binary frames"),
    ("{not json", "InvalidMessage", "JSON"),
    (json.dumps({"header": {"action": "dance", "task_id": "t"}, "payload": {}}), "InvalidMessage", "unknown action"),
    (action("continue-task", "nope", "hi"), "InvalidTask", "run-task first"),
    (action("finish-task", "nope"), "InvalidTask", "run-task first"),
    ("[" * 100_000 + "]" * 100_000, "InvalidMessage", "JSON"),  # nested too deeply: RecursionError
    (json.dumps({"header": {"action": "d." * 100_000, "task_id": "t"}, "payload": {}}), "InvalidMessage",
     "unknown action 'd.d.d."),
    (action("continue-task", "t" * 100_000, "hi"), "InvalidParameter", "task_id is 100000 characters; at most 256"),
    (run_task("t", "x", bit_rate="²"), "InvalidParameter", "bit_rate '²' is not a bit rate"),  # int("²") fails
    (run_task("t", "r" * 100_000), "InvalidParameter", "invalid reference audio id 'rrrr"),
])
def test_bad_messages_fail_and_connection_stays_usable(stack, send, code, words):
    async def main():
        async with websockets.connect(ws_url(stack)) as ws:
            await ws.send(send)
            failed = json.loads(await ws.recv())
            await ws.send(run_task("t2", "no-such-voice"))
            unknown = json.loads(await ws.recv())
            return failed, unknown

    failed, unknown = asyncio.run(main())
    assert failed["header"]["event"] == "task-failed" and failed["header"]["error_code"] == code
    assert words in failed["header"]["error_message"]
    assert len(json.dumps(failed)) < 600  # what was sent is quoted in part only
    assert unknown["header"]["event"] == "task-failed" and unknown["header"]["task_id"] == "t2"
    assert unknown["header"]["error_code"] == "NotFound" and "no-such-voice" in unknown["header"]["error_message"]


def test_bad_parameters_text_limit_and_disconnect(stack):
    async def main():
        out = {}
        async with websockets.connect(ws_url(stack)) as ws:
            await ws.send(run_task("a", stack.ref, sample_rate=5))
            out["rate"] = json.loads(await ws.recv())
            await ws.send(run_task("b", stack.ref, mode="natural_language_replication"))
            out["instruct"] = json.loads(await ws.recv())
            await ws.send(run_task("c", stack.ref))
            assert json.loads(await ws.recv())["header"]["event"] == "task-started"
            await ws.send(run_task("d", stack.ref))
            out["second"] = json.loads(await ws.recv())
            await ws.send(action("continue-task", "c", "x" * 20001))
            out["long"] = json.loads(await ws.recv())
            await ws.send(run_task("empty", stack.ref))  # a task whose text has nothing to speak
            assert json.loads(await ws.recv())["header"]["event"] == "task-started"
            await ws.send(action("continue-task", "empty", "  "))
            await ws.send(action("finish-task", "empty"))
            out["empty"] = json.loads(await ws.recv())
            # a new task after the failed one; then the client leaves mid-task
            await ws.send(run_task("e", stack.ref))
            assert json.loads(await ws.recv())["header"]["event"] == "task-started"
            for piece in PIECES:
                await ws.send(action("continue-task", "e", piece))
        for _ in range(100):  # the job was cancelled: the pool is idle again
            if stack.pool.stats()["busy"] == 0:
                break
            await asyncio.sleep(0.1)
        out["busy"] = stack.pool.stats()["busy"]
        return out

    out = asyncio.run(main())
    assert out["rate"]["header"]["error_code"] == "InvalidParameter"
    assert "sample_rate" in out["rate"]["header"]["error_message"]
    assert "instruct" in out["instruct"]["header"]["error_message"]
    assert out["second"]["header"]["error_code"] == "InvalidTask" and "still running" in \
        out["second"]["header"]["error_message"]
    assert out["long"]["header"]["task_id"] == "c" and "limit is 20000" in out["long"]["header"]["error_message"]
    assert out["empty"]["header"]["error_code"] == "InvalidParameter"
    assert "text is empty" in out["empty"]["header"]["error_message"]
    assert out["busy"] == 0


def test_a_repeated_finish_task_is_ignored_and_the_audio_comes(stack):
    """A second finish-task (or input.done) for a task that is finishing failed the task, and its audio never
    came: it is ignored, as is one for the task that has just ended."""
    async def pai():
        async with websockets.connect(ws_url(stack), max_size=None) as ws:
            await ws.send(run_task("f", stack.ref))
            assert json.loads(await ws.recv())["header"]["event"] == "task-started"
            await ws.send(action("continue-task", "f", "你好，世界。"))
            await ws.send(action("finish-task", "f"))
            await ws.send(action("finish-task", "f"))
            events, audio = [], 0
            while not events or events[-1]["header"]["event"] not in ("task-finished", "task-failed"):
                e = json.loads(await asyncio.wait_for(ws.recv(), 300))
                audio += len(e["payload"].get("output", {}).get("audio", {}).get("data", ""))
                events.append(e)
            await ws.send(action("finish-task", "f"))  # after task-finished: still nothing to say
            await ws.send(action("continue-task", "f", "late"))
            late = json.loads(await asyncio.wait_for(ws.recv(), 60))
            return events, audio, late

    async def openai_style():
        async with websockets.connect(ws_url(stack, "/v1/audio/speech/stream"), max_size=None) as ws:
            await ws.send(json.dumps({"type": "session.config", "voice": stack.ref, "response_format": "pcm"}))
            assert json.loads(await ws.recv())["type"] == "session.created"
            await ws.send(json.dumps({"type": "input.text", "delta": "你好，世界。"}))
            await ws.send(json.dumps({"type": "input.done"}))
            await ws.send(json.dumps({"type": "input.done"}))
            events = []
            while not events or events[-1]["type"] not in ("speech.audio.done", "error"):
                events.append(json.loads(await asyncio.wait_for(ws.recv(), 300)))
            return events

    events, audio, late = asyncio.run(pai())
    kinds = [e["header"]["event"] for e in events]
    assert kinds[-1] == "task-finished" and set(kinds[:-1]) == {"result-generated"} and audio > 0, kinds
    assert late["header"]["event"] == "task-failed" and late["header"]["error_code"] == "InvalidTask"
    assert "continue-task for task 'f'" in late["header"]["error_message"]  # the repeat said nothing
    events = asyncio.run(openai_style())
    assert [e["type"] for e in events][-1] == "speech.audio.done" and len(events) > 1, events[-1]


def test_idle_timeout(stack):
    stack.service.ws_idle_timeout = 1.0
    try:
        async def main():
            async with websockets.connect(ws_url(stack)) as ws:
                await ws.send(run_task("idle", stack.ref))
                started = json.loads(await ws.recv())
                failed = json.loads(await ws.recv())
                with pytest.raises(websockets.ConnectionClosed) as closed:
                    await ws.recv()
                return started, failed, closed.value.rcvd.code
        started, failed, code = asyncio.run(main())
    finally:
        stack.service.ws_idle_timeout = 60.0
    assert started["header"]["event"] == "task-started"
    assert failed["header"]["error_code"] == "IdleTimeout" and code == 1000


def test_ws_needs_the_key(stack):
    async def main():
        for headers in ({}, {"Authorization": "Bearer wrong"}):  # refused in the handshake (a close before accept)
            with pytest.raises(websockets.InvalidStatus) as refused:
                async with websockets.connect(ws_url(stack, keyed=True), additional_headers=headers):
                    pass
            assert refused.value.response.status_code == 403
        async with websockets.connect(ws_url(stack, keyed=True),
                                      additional_headers={"Authorization": f"Bearer {KEY}"}) as ws:
            await ws.send(action("finish-task", "x"))
            return json.loads(await ws.recv())

    assert asyncio.run(main())["header"]["event"] == "task-failed"


def test_dashscope_sdk_streaming_call(stack):
    """The real `dashscope` SDK's SpeechSynthesizer, its websocket URL pointed at us, a reference id as voice."""
    pieces = ["你好", "，世界", "。今天", "天气很好。"]
    cb = dashscope_task(ws_url(stack, "/api-ws/v1/inference", keyed=True), KEY, pieces, voice=stack.ref, volume=50,
                        speech_rate=1.0)
    assert cb.completed and len(cb.audio) > 0 and len(cb.audio) % 2 == 0
    seconds = len(cb.audio) / 2 / RATE
    assert cb.events and all(e["header"]["event"] == "result-generated" for e in cb.events)
    # the sentence events: begin 0, its audio frames, end 0 (with its text), begin 1, ..., end 1
    outputs = [e["payload"]["output"] for e in cb.events]
    kinds = "".join({"sentence-begin": "b", "sentence-synthesis": "s", "sentence-end": "e"}[o["type"]]
                    for o in outputs)
    assert re.fullmatch(r"bs*ebs*e", kinds), kinds
    ends = [o for o in outputs if o["type"] == "sentence-end"]
    assert [o["original_text"] for o in ends] == ["你好，世界。", "今天天气很好。"]
    assert [o["sentence"]["index"] for o in ends] == [0, 1]
    assert ends[-1]["sentence"]["index"] == outputs[-2]["sentence"]["index"] == 1
    ends_usage = [e["payload"]["usage"]["characters"] for e in cb.events
                  if e["payload"]["output"]["type"] == "sentence-end"]
    assert ends_usage == [len("你好，世界。"), len("你好，世界。今天天气很好。")]  # through each sentence
    frames = [e for e in cb.events if e["payload"]["output"]["type"] == "sentence-synthesis"]
    assert abs(sum(e["payload"]["metrics"]["speech_len"] for e in frames) - seconds) < 0.01
    assert cb.first_package_delay > 0


def test_openai_style_session(stack):
    """session.config -> input.text deltas -> input.done: audio deltas, then done; twice on one connection,
    with the errors in between leaving it usable."""
    async def main():
        async with websockets.connect(ws_url(stack, "/v1/audio/speech/stream")) as ws:
            await ws.send(json.dumps({"type": "input.text", "delta": "early"}))
            early = json.loads(await ws.recv())
            await ws.send(json.dumps({"type": "session.config", "voice": "nobody"}))
            unknown = json.loads(await ws.recv())
            sessions = []
            for fmt in ("pcm", "wav"):
                await ws.send(json.dumps({"type": "session.config", "voice": stack.ref, "response_format": fmt,
                                          "seed": 2}))
                created = json.loads(await ws.recv())
                for piece in ["你好", "，世界", "。"]:
                    await ws.send(json.dumps({"type": "input.text", "delta": piece}))
                await ws.send(json.dumps({"type": "input.done"}))
                events = []
                while not events or events[-1]["type"] not in ("speech.audio.done", "error"):
                    events.append(json.loads(await ws.recv()))
                sessions.append((created, events))
            return early, unknown, sessions

    early, unknown, sessions = asyncio.run(main())
    assert early["type"] == "error" and early["error"]["code"] == "no_session"
    assert unknown["type"] == "error" and unknown["error"]["code"] == "not_found"
    lengths = []
    for (created, events), fmt in zip(sessions, ("pcm", "wav")):
        assert created["type"] == "session.created" and created["response_format"] == fmt
        assert created["sample_rate"] == RATE
        assert [e["type"] for e in events[:-1]] == ["speech.audio.delta"] * (len(events) - 1)
        done = events[-1]
        assert done["type"] == "speech.audio.done" and done["usage"]["input_tokens"] == len("你好，世界。")
        audio = b"".join(base64.b64decode(e["audio"]) for e in events[:-1])
        samples = len(audio) // 2 if fmt == "pcm" else len(sf.read(io.BytesIO(audio))[0])
        assert abs(done["usage"]["output_tokens"] - samples / RATE * 25) <= 1
        lengths.append(samples)
    assert lengths[0] == lengths[1] > 0  # same seed and text: the same audio in either format


def test_complete_sentences_are_spoken_before_finish_task(stack, patient):
    """Three whole sentences in one continue-task, no finish-task yet: their audio comes (the LM decodes the
    duplex text per sentence), and finish-task then ends the task."""
    async def main():
        async with websockets.connect(ws_url(stack), max_size=None) as ws:
            await ws.send(run_task("open", stack.ref, mode="fast_replication"))
            assert json.loads(await ws.recv())["header"]["event"] == "task-started"
            await ws.send(action("continue-task", "open", "今天天气很好。我们去公园散步吧。你觉得怎么样？"))
            first = json.loads(await asyncio.wait_for(ws.recv(), 120))
            await ws.send(action("finish-task", "open"))
            events = [first]
            while events[-1]["header"]["event"] == "result-generated":
                events.append(json.loads(await asyncio.wait_for(ws.recv(), 300)))
            return events

    events = asyncio.run(main())
    assert "audio" in events[0]["payload"]["output"], events[0]  # before finish-task was sent
    assert events[-1]["header"]["event"] == "task-finished", events[-1]


def test_a_session_waiting_for_its_own_audio_is_not_idle(stack):
    """run-task, a sentence and finish-task while a long HTTP synthesis holds the only worker: the session
    waits for its audio longer than the idle timeout and still gets it."""
    import threading

    import httpx
    stack.service.ws_idle_timeout = 1.0
    body = {"input": {"mode": "fast_replication", "text": LONG_TEXT, "reference_audio_id": stack.ref},
            "stream": False}
    busy = threading.Thread(target=lambda: httpx.post(f"{stack.url}/api/v1/audio/speech", json=body, timeout=300))
    try:
        busy.start()
        time.sleep(0.5)  # the long synthesis takes the worker first

        async def main():
            async with websockets.connect(ws_url(stack), max_size=None) as ws:
                await ws.send(run_task("wait", stack.ref))
                assert json.loads(await ws.recv())["header"]["event"] == "task-started"
                start = time.monotonic()
                await ws.send(action("continue-task", "wait", "你好，世界。"))
                await ws.send(action("finish-task", "wait"))
                kinds = []
                while not kinds or kinds[-1] == "result-generated":
                    msg = json.loads(await asyncio.wait_for(ws.recv(), 300))
                    kinds.append((msg["header"]["event"], msg["header"].get("error_code")))
                    kinds[-1] = kinds[-1][0] if kinds[-1][1] is None else kinds[-1]
                return kinds, time.monotonic() - start

        kinds, waited = asyncio.run(main())
    finally:
        busy.join(300)
        stack.service.ws_idle_timeout = 60.0
    assert kinds[-1] == "task-finished", kinds
    assert waited > 1.0  # it did wait longer than the idle timeout


def test_the_pool_is_idle_once_every_session_has_ended(stack):
    """Last in the module: the sessions above end every way (finish, cancel, idle timeout, a client that
    leaves); none may leave a job running or waiting in the worker pool."""
    import time
    deadline = time.monotonic() + 10
    while (s := stack.pool.stats())["busy"] or s["waiting"]:
        assert time.monotonic() < deadline, f"the pool is not idle 10 s after the sessions ended: {s}"
        time.sleep(0.1)
