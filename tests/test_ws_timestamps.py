"""Sentence timings on the WebSockets (issue 55), real clients against the shared real app (tests/http_stack.py:
the tiny model, a real worker pool): the sentence events tile the audio received, their offsets index the text
as sent across continue-task messages, the dashscope SDK receives them unchanged, and asking for them changes
no audio byte."""
from __future__ import annotations

import asyncio
import base64
import io
import json
import re

import httpx
import pytest
import soundfile as sf
import websockets
from dashscope_client import dashscope_task
from http_stack import KEY, ZS_TEXT, ZS_WAV, _app, _serve
from test_ws import RATE, action, one_task, run_task, ws_url

from cosy.deploy.data_dir import DataDir
from cosy.frontend.service import FrontendService
from cosy.service.workers import EngineSpec, WorkerPool
from cosy.verify.random_model import write_random_model

# a number and a word cut across continue-task messages; short sentences (the random LM runs each to its
# max_len); seed 4 as tests/test_duplex_timing.py
PIECES = ["第1", "2。好", "！ Hi wor", "ld."]
CALLER = "".join(PIECES)
SENTENCES = ["第12。", "好！", "Hi world."]


def sentence_events(events: list[dict]) -> list[tuple[str, dict]]:
    return [(e["payload"]["output"]["type"], e["payload"]["output"]["sentence"]) for e in events
            if e["header"]["event"] == "result-generated" and "sentence" in e["payload"]["output"]
            and e["payload"]["output"]["type"] != "sentence-synthesis"]


def assert_tiles(marks: list[tuple[str, dict]], seconds: float, begin="sentence-begin", end="sentence-end") -> None:
    """begin 0, end 0, begin 1, ...: each sentence's text is the caller's own at its offsets, the sentences
    follow each other without gap from 0 to the end of the audio received (ms, rounded)."""
    assert [(k, s["index"]) for k, s in marks] == [(k, i) for i in range(len(SENTENCES)) for k in (begin, end)]
    ends = [s for k, s in marks if k == end]
    assert [s["text"] for s in ends] == SENTENCES
    assert all(CALLER[s["begin_index"]:s["end_index"]] == s["text"] for s in ends)
    assert ends[0]["begin_time"] == 0 and abs(ends[-1]["end_time"] - seconds * 1000) <= 1
    assert all(a["end_time"] == b["begin_time"] < b["end_time"] for a, b in zip(ends, ends[1:]))
    assert all(s["end_time"] is None for k, s in marks if k == begin)


def test_pai_sentence_timings_tile_the_audio_and_change_no_byte(stack):
    async def main():
        async with websockets.connect(ws_url(stack), max_size=None) as ws:
            timed = await one_task(ws, stack.ref, PIECES, 0.05, seed=4, sentence_timestamp_enabled=True)
            plain = await one_task(ws, stack.ref, PIECES, 0.05, seed=4)
        return timed, plain

    (_, events, audio, _), (_, plain_events, plain_audio, _) = asyncio.run(main())
    assert events[-1]["header"]["event"] == "task-finished"
    wav, rate = sf.read(io.BytesIO(audio))
    assert rate == RATE
    marks = sentence_events(events)
    assert_tiles(marks, len(wav) / RATE)
    assert all("words" not in s for _, s in marks)  # words only with word_timestamp_enabled
    # each sentence's begin comes before the audio that holds its first sample, its end after its last
    kinds = "".join("a" if "audio" in e["payload"]["output"] else e["payload"]["output"]["type"][9]
                    for e in events[:-1])
    assert re.fullmatch(r"ba+(eba+)*a*e", kinds), kinds
    assert audio == plain_audio and not sentence_events(plain_events)  # asked or not: the same bytes


def test_word_timestamps_without_an_aligner_fail_the_task_naming_the_flag(stack):
    async def main():
        async with websockets.connect(ws_url(stack)) as ws:
            await ws.send(run_task("w", stack.ref, word_timestamp_enabled=True))
            started = json.loads(await ws.recv())
            await ws.send(action("continue-task", "w", "你好。"))
            await ws.send(action("finish-task", "w"))
            return started, json.loads(await asyncio.wait_for(ws.recv(), 120))

    started, failed = asyncio.run(main())
    assert started["header"]["event"] == "task-started"
    assert failed["header"]["event"] == "task-failed" and failed["header"]["error_code"] == "InvalidParameter"
    assert "word_timestamp_enabled" in failed["header"]["error_message"]
    assert "--aligner" in failed["header"]["error_message"]


def test_dashscope_sdk_receives_the_sentence_timings(stack):
    """The real `dashscope` SDK (its published way to add parameters: additional_params) gets the sentence
    events with their timings as our server sends them."""
    cb = dashscope_task(ws_url(stack, "/api-ws/v1/inference", keyed=True), KEY, PIECES, voice=stack.ref, seed=4,
                        additional_params={"sentence_timestamp_enabled": True})
    assert cb.completed and len(cb.audio) % 2 == 0
    outputs = [e["payload"]["output"] for e in cb.events]
    kinds = "".join({"sentence-begin": "b", "sentence-synthesis": "s", "sentence-end": "e"}[o["type"]]
                    for o in outputs)
    assert re.fullmatch(r"(bs+e)+", kinds), kinds
    assert_tiles(sentence_events(cb.events), len(cb.audio) / 2 / RATE)
    ends = [e for e in cb.events if e["payload"]["output"]["type"] == "sentence-end"]
    assert [e["payload"]["output"]["original_text"] for e in ends] == SENTENCES
    assert [e["payload"]["usage"]["characters"] for e in ends] == [CALLER.index(s) + len(s) for s in SENTENCES]
    # each audio frame's sentence-synthesis names the sentence being spoken
    current = None
    for o in outputs:
        current = o["sentence"]["index"] if o["type"] == "sentence-begin" else current
        assert o["sentence"]["index"] == current


def test_openai_style_session_sends_sentence_events_when_asked(stack):
    async def main():
        async with websockets.connect(ws_url(stack, "/v1/audio/speech/stream")) as ws:
            await ws.send(json.dumps({"type": "session.config", "voice": stack.ref, "response_format": "pcm",
                                      "seed": 4, "instructions": "", "sentence_timestamp_enabled": True}))
            assert json.loads(await ws.recv())["type"] == "session.created"
            for piece in PIECES:
                await ws.send(json.dumps({"type": "input.text", "delta": piece}))
            await ws.send(json.dumps({"type": "input.done"}))
            events = []
            while not events or events[-1]["type"] not in ("speech.audio.done", "error"):
                events.append(json.loads(await asyncio.wait_for(ws.recv(), 300)))
            return events

    events = asyncio.run(main())
    assert events[-1]["type"] == "speech.audio.done", events[-1]
    samples = len(b"".join(base64.b64decode(e["audio"]) for e in events if e["type"] == "speech.audio.delta")) // 2
    marks = [(e["type"], e["sentence"]) for e in events if e["type"].startswith("speech.sentence.")]
    assert_tiles(marks, samples / RATE, "speech.sentence.begin", "speech.sentence.end")


@pytest.fixture(scope="module")
def aligned(tiny_model_dir, tmp_path_factory):
    """A frontend started with an aligner (`--aligner`: our builder's random-weight MMS directory)."""
    aligner = write_random_model(tmp_path_factory.mktemp("aligner"), "tiny", family="mms-aligner")
    pool = WorkerPool(EngineSpec(str(tiny_model_dir), aligner=str(aligner)), workers=1, max_queue=4).start()
    service = FrontendService(pool, DataDir(tmp_path_factory.mktemp("data")))
    server, thread, url = _serve(_app(service, KEY, lambda: (True, "ok")))
    r = httpx.post(f"{url}/api/v1/audio/reference_audio", files={"file": ("prompt.wav", ZS_WAV.read_bytes())},
                   data={"text": ZS_TEXT}, headers={"Authorization": f"Bearer {KEY}"}, timeout=60)
    assert r.status_code == 200, r.text
    yield url, r.json()["id"]
    server.should_exit = True
    thread.join(10)
    pool.close()


def test_dashscope_sdk_receives_word_timings(aligned):
    """word_timestamp_enabled with an aligner: each sentence-end carries its words as published (offsets
    within the sentence, times in the audio, inside the sentence's own)."""
    url, ref = aligned
    task = dashscope_task(url.replace("http://", "ws://") + "/api-ws/v1/inference", KEY,
                          ["The day was go", "od. And we", " went home."], voice=ref, seed=4,
                          additional_params={"word_timestamp_enabled": True})
    events = task.events
    ends = [e["payload"]["output"] for e in events if e["payload"]["output"]["type"] == "sentence-end"]
    assert [o["original_text"] for o in ends] == ["The day was good.", "And we went home."]
    for o in ends:
        s = o["sentence"]
        assert [w["text"] for w in s["words"]] == [t.strip(".") for t in o["original_text"].split()]
        assert all(o["original_text"][w["begin_index"]:w["end_index"]] == w["text"] for w in s["words"])
        assert all(s["begin_time"] <= w["begin_time"] <= w["end_time"] <= s["end_time"] for w in s["words"])
