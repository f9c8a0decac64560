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
