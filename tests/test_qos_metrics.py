"""Streaming quality of service as a listener hears it (`cosy.frontend.qos.Playback`) and the series /metrics
serves for it, by priority class and API, through the real HTTP stack (tests/http_stack.py: a real worker pool
on the tiny model)."""
from __future__ import annotations

import httpx
import pytest
from http_stack import MEDIUM, SHORT, _error
from servers import metric

from cosy.frontend.qos import Playback

# ---------------------------------------------------------------------------------------------- the player


@pytest.mark.quick
def test_a_stream_that_keeps_ahead_of_its_listener_is_continuous():
    play = Playback(received=10.0)
    for i in range(4):
        play.chunk(11.0 + 0.5 * i, 1.0)  # a second of audio every half second
    assert play.first_packet == 1.0 and play.gaps == [0.5, 0.5, 0.5]
    assert play.underrun == 0.0 and play.continuous and play.audio == 4.0


@pytest.mark.quick
def test_an_underrun_counts_the_listeners_wait_once_not_again_for_every_later_chunk():
    """The player pauses while it waits, so the chunks after a late one are due later too: 0.5 s then 0.1 s
    of waiting, 0.6 s in all (measuring each chunk against the first packet's clock would count 1.1 s)."""
    play = Playback(received=0.0)
    play.chunk(1.0, 1.0)  # plays 1.0-2.0
    play.chunk(2.5, 1.0)  # 0.5 s of silence; plays 2.5-3.5
    play.chunk(3.6, 1.0)  # 0.1 s of silence
    play.chunk(3.7, 1.0)  # on time: due at 4.6
    assert play.underrun == pytest.approx(0.6) and not play.continuous
    assert play.gaps == pytest.approx([1.5, 1.1, 0.1])


# ---------------------------------------------------------------------------------------------- /metrics


def _stream(stack, text: str, **extra) -> int:
    body = {"input": {"mode": "fast_replication", "text": text, "reference_audio_id": stack.ref, **extra}}
    events = 0
    with httpx.stream("POST", f"{stack.url}/api/v1/audio/speech", json=body, timeout=120) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            events += line.startswith("data:")
    return events


def test_the_series_by_class_and_api(stack):
    assert _stream(stack, MEDIUM) > 1  # a stream: interactive
    assert _stream(stack, SHORT, priority="bulk") > 0  # a stream that chose a less urgent class
    body = {"input": {"mode": "fast_replication", "text": SHORT, "reference_audio_id": stack.ref}, "stream": False}
    assert httpx.post(f"{stack.url}/api/v1/audio/speech", json=body, timeout=120).status_code == 200  # default
    refused = httpx.post(f"{stack.url}/api/v1/audio/speech", json={**body, "priority": "interactive"}, timeout=60)
    _error(refused, 400, "invalid_request_error", "priority 'interactive' is more urgent", "--allow_priority")
    speech = stack.client.audio.speech.create(model="m", voice=stack.ref, input=SHORT, response_format="pcm",
                                              extra_body={"priority": "default"})
    assert len(speech.content) > 0
    text = httpx.get(f"{stack.url}/metrics", timeout=10).text

    def value(name: str, **labels: str) -> float:
        return metric(text, name, **labels)

    live = {"priority": "interactive", "api": "pai"}
    assert value("cosy_stream_first_packet_seconds_count", **live) == 1
    assert value("cosy_streams_total", **live) == 1 and value("cosy_stream_underrun_seconds_count", **live) == 1
    assert value("cosy_streams_continuous_total", **live) <= 1
    assert value("cosy_stream_chunk_gap_seconds_count", **live) >= 2  # MEDIUM: three streaming chunks or more
    assert value("cosy_stream_audio_seconds_total", **live) > 1.0
    assert value("cosy_queue_wait_seconds_count", **live) == 1
    assert value("cosy_streams_total", priority="bulk", api="pai") == 1
    assert value("cosy_queue_wait_seconds_count", priority="default", api="pai") == 1  # the whole file
    assert value("cosy_stream_first_packet_seconds_count", priority="default", api="pai") == 0  # not a stream
    assert value("cosy_streams_total", priority="default", api="openai") == 1  # OpenAI's speech always streams
    assert value("cosy_queue_wait_seconds_count", priority="interactive", api="openai") == 0
    assert value("cosy_queue_wait_seconds_count") == 4  # the refused request never reached the queue
    assert value("cosy_backend_share_count") == 0  # the embedded LM: no backend to wait for
    assert 'cosy_queue_waiting_by_priority{priority="bulk"} 0.0' in text


def test_the_sockets_take_a_class_and_their_streams_are_counted_under_it(stack):
    """A PAI socket task asking for bulk, an OpenAI-style session at its default (interactive), and a task asking
    for a class that does not exist (task-failed naming the choices)."""
    import asyncio
    import json
    import uuid

    import websockets

    base = stack.url.replace("http://", "ws://")

    async def pai_task(priority: str) -> list[dict]:
        task = str(uuid.uuid4())
        params = {"mode": "fast_replication", "reference_audio_id": stack.ref, "output_format": "pcm",
                  "priority": priority}
        events = []
        async with websockets.connect(base + "/api-ws/v1/audio/speech", max_size=None) as ws:
            await ws.send(json.dumps({"header": {"action": "run-task", "task_id": task, "streaming": "duplex"},
                                      "payload": {"parameters": params, "input": {}}}))
            for name, text in (("continue-task", SHORT), ("finish-task", None)):
                payload = {"input": {"text": text}} if text else {"input": {}}
                await ws.send(json.dumps({"header": {"action": name, "task_id": task}, "payload": payload}))
            while True:
                msg = await asyncio.wait_for(ws.recv(), 300)
                if isinstance(msg, bytes):
                    continue
                events.append(json.loads(msg))
                if events[-1]["header"]["event"] in ("task-finished", "task-failed"):
                    return events

    async def openai_session() -> str:
        async with websockets.connect(base + "/v1/audio/speech/stream", max_size=None) as ws:
            await ws.send(json.dumps({"type": "session.config", "voice": stack.ref, "response_format": "pcm"}))
            await ws.send(json.dumps({"type": "input.text", "delta": SHORT}))
            await ws.send(json.dumps({"type": "input.done"}))
            while (kind := json.loads(await asyncio.wait_for(ws.recv(), 300))["type"]) not in (
                    "speech.audio.done", "error"):
                pass
            return kind

    def streams(**labels: str) -> float:
        return metric(httpx.get(f"{stack.url}/metrics", timeout=10).text, "cosy_streams_total", **labels)

    before = streams(priority="bulk", api="pai"), streams(priority="interactive", api="openai")
    assert asyncio.run(pai_task("bulk"))[-1]["header"]["event"] == "task-finished"
    failed = asyncio.run(pai_task("urgent"))[-1]
    assert failed["header"]["event"] == "task-failed" and "priority" in failed["header"]["error_message"]
    assert asyncio.run(openai_session()) == "speech.audio.done"
    after = streams(priority="bulk", api="pai"), streams(priority="interactive", api="openai")
    assert (after[0] - before[0], after[1] - before[1]) == (1, 1)
