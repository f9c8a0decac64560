"""Sentence timestamps on the HTTP APIs over real HTTP (issue 55): the PAI route (SSE events and the whole JSON
answer) and the OpenAI route (SSE sentence events, the JSON form of the audio answer). Timings appear only when
asked (answers otherwise as before), tile the audio they describe, and index the text that was sent."""
from __future__ import annotations

import base64
import io
import json

import httpx
import numpy as np
import soundfile as sf
from http_stack import RATE, _error

from cosy.pipeline.request import SynthesisRequest

# two sentences after normalization (digits become words: the offsets must still index what was sent)
TWO = ("今天是2024年12月7日，天气很好，气温大约15度，我们一家人一起去城市北边的公园散步，看看花草树木，听听鸟儿"
       "唱歌，心情非常愉快。回家的路上，我们买了3斤苹果和两瓶牛奶，晚上一起做饭。")
SENTENCE = ("index", "text", "begin_time", "end_time", "begin_index", "end_index")
BREAK_MS = 500
SSML = f'<speak>你好。<break time="{BREAK_MS}ms"/>再见。</speak>'


def _pai_body(stack, text: str = TWO, stream: bool = False, fmt: str = "wav", **options) -> dict:
    return {"model": "CosyVoice2-0.5B", "stream": stream,
            "input": {"mode": "fast_replication", "text": text, "reference_audio_id": stack.ref,
                      "output_format": fmt, "seed": 11, **options}}


def _pai_whole(stack, **kw) -> dict:
    r = httpx.post(f"{stack.url}/api/v1/audio/speech", json=_pai_body(stack, **kw), timeout=300)
    assert r.status_code == 200, r.text
    return r.json()


def _sse(url: str, body: dict) -> list[dict]:
    events = []
    with httpx.stream("POST", url, json=body, timeout=300) as r:
        assert r.status_code == 200, r.read()
        assert r.headers["content-type"].startswith("text/event-stream")
        for line in r.iter_lines():
            if line.startswith("data: "):
                events.append(json.loads(line[6:]))
    return events


def assert_sentences(sentences: list[dict], text: str, samples: int, words: bool = False) -> None:
    """The managed service's fields; each one's text is the span it names of `text`, the spans in order; the
    sentences tile the audio of `samples` samples at 24 kHz (plain text: no gaps)."""
    assert sentences, "no sentences"
    for i, s in enumerate(sentences):
        assert tuple(s) == SENTENCE + (("words",) if words else ()), s
        assert s["index"] == i
        assert 0 <= s["begin_index"] < s["end_index"] <= len(text)
        assert s["text"] == text[s["begin_index"]:s["end_index"]], s
    for a, b in zip(sentences, sentences[1:]):
        assert a["end_index"] <= b["begin_index"]
        assert a["end_time"] == b["begin_time"], (a, b)
    assert sentences[0]["begin_time"] == 0
    assert sentences[-1]["end_time"] == round(samples * 1000 / RATE)


def test_pai_whole_answer_lists_the_sentences_only_when_asked(stack):
    bare = _pai_whole(stack)
    timed = _pai_whole(stack, sentence_timestamp_enabled=True)
    assert set(bare["output"]) == {"finish_reason", "audio"}  # as published when not asked
    wav = base64.b64decode(timed["output"]["audio"]["data"])
    assert wav == base64.b64decode(bare["output"]["audio"]["data"])  # timestamps change no sample
    audio, rate = sf.read(io.BytesIO(wav), dtype="int16")
    assert rate == RATE
    sentences = timed["output"]["sentences"]
    assert len(sentences) == 2 and sentences[0]["text"].startswith("今天是2024年") and "3斤" in sentences[1]["text"]
    assert_sentences(sentences, TWO, len(audio))
    # the rest of the answer is what it was: only request ids differ
    for out in (bare, timed):
        out["request_id"] = out["output"]["audio"]["id"] = "-"
        out["output"]["audio"]["data"] = "-"
    timed["output"].pop("sentences")
    assert json.dumps(timed) == json.dumps(bare)


def test_pai_sse_events_carry_each_sentence_begin_and_end(stack):
    url = f"{stack.url}/api/v1/audio/speech"
    events = _sse(url, _pai_body(stack, stream=True, fmt="pcm", word_timestamp_enabled=False,
                                 sentence_timestamp_enabled=True, debug=True))
    marks, sent = [], 0  # (mark, pcm bytes sent before its event, through its event)
    for e in events:
        assert set(e["output"]) == {"finish_reason", "audio", "sentences"} and e["error"] is None
        data = len(base64.b64decode(e["output"]["audio"]["data"]))
        assert data > 0 and e["metrics"]["speech_len"] > 0  # still: every event carries audio
        marks += [(m, sent, sent + data) for m in e["output"]["sentences"]]
        sent += data
    kinds = [(m["type"], m["sentence"]["index"]) for m, _, _ in marks]
    assert kinds == [(k, i) for i in range(2) for k in ("sentence-begin", "sentence-end")], kinds
    for m, before, through in marks:
        s = m["sentence"]
        first, last = s["begin_time"] * RATE // 1000, (s["end_time"] or 0) * RATE // 1000
        if m["type"] == "sentence-begin":
            assert s["end_time"] is None
            assert before <= 2 * first  # it comes with the sentence's first audio, not later
        else:
            assert through >= 2 * (last - 24)  # with the event holding its last audio (ms rounding: 1 ms)
    ends = [m["sentence"] for m, _, _ in marks if m["type"] == "sentence-end"]
    assert_sentences(ends, TWO, sent // 2)
    assert [m["sentence"]["begin_time"] for m, _, _ in marks if m["type"] == "sentence-begin"] == \
        [s["begin_time"] for s in ends]
    # not asked: the published events, nothing added
    for e in _sse(url, _pai_body(stack, text="你好。", stream=True, fmt="pcm", sentence_timestamp_enabled=False)):
        assert set(e["output"]) == {"finish_reason", "audio"}


def test_pai_ssml_offsets_index_the_documents_text_and_breaks_are_gaps(stack):
    out = _pai_whole(stack, text=SSML, enable_ssml=True, sentence_timestamp_enabled=True)
    text = SynthesisRequest(mode="voice", text=SSML, ssml=True).ssml_document().text
    audio, _ = sf.read(io.BytesIO(base64.b64decode(out["output"]["audio"]["data"])), dtype="int16")
    sentences = out["output"]["sentences"]
    assert [s["text"] for s in sentences] == ["你好。", "再见。"]
    for s in sentences:
        assert s["text"] == text[s["begin_index"]:s["end_index"]]
    gap = sentences[1]["begin_time"] - sentences[0]["end_time"]
    assert abs(gap - BREAK_MS) <= 1, gap
    assert sentences[-1]["end_time"] == round(len(audio) * 1000 / RATE)
    second = round(sentences[1]["begin_time"] * RATE / 1000)
    end = round(sentences[0]["end_time"] * RATE / 1000)
    assert not audio[end + 2:second - 2].any()  # the break is silence, where the timings say


def test_openai_sse_sentence_events_beside_the_audio(stack):
    body = {"model": "tts-1", "voice": stack.ref, "input": TWO, "response_format": "pcm", "stream_format": "sse",
            "seed": 11, "sentence_timestamp_enabled": True}
    events = _sse(f"{stack.url}/v1/audio/speech", body)
    types = [e["type"] for e in events]
    assert types[0] == "speech.sentence.begin"
    # the last sentence's end, then the delta with its last 20 ms (held back for the tail), then done
    assert types[-3:] == ["speech.sentence.end", "speech.audio.delta", "speech.audio.done"]
    sent, ends, hold = 0, [], round(0.02 * RATE)  # speech_stream.HOLD_SECONDS
    for e in events:
        if e["type"] == "speech.audio.delta":
            sent += len(base64.b64decode(e["audio"]))
        elif e["type"] == "speech.sentence.begin":
            assert set(e) == {"type", "sentence"} and e["sentence"]["end_time"] is None
            assert sent <= 2 * e["sentence"]["begin_time"] * RATE // 1000  # before its first audio
        elif e["type"] == "speech.sentence.end":
            assert sent >= 2 * (e["sentence"]["end_time"] * RATE // 1000 - hold - 24)  # all but the last 20 ms
            ends.append(e["sentence"])
    assert [t for t in types if t.startswith("speech.sentence")] == ["speech.sentence.begin", "speech.sentence.end"] * 2
    assert_sentences(ends, TWO, sent // 2)


def test_openai_audio_answer_with_timestamps_is_json_with_the_same_file(stack):
    body = {"model": "tts-1", "voice": stack.ref, "input": TWO, "response_format": "wav", "seed": 11}
    bare = httpx.post(f"{stack.url}/v1/audio/speech", json=body, timeout=300)
    assert bare.status_code == 200 and bare.headers["content-type"] == "audio/wav"
    r = httpx.post(f"{stack.url}/v1/audio/speech", json={**body, "sentence_timestamp_enabled": True}, timeout=300)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == "application/json" and r.headers["x-cosy-speed"] == "1"
    out = r.json()
    assert set(out) == {"audio", "sentences", "usage"}
    wav = base64.b64decode(out["audio"])
    assert wav == bare.content  # the same file, timestamps change no sample
    audio, _ = sf.read(io.BytesIO(wav), dtype="int16")
    assert np.abs(audio).max() > 0
    assert_sentences(out["sentences"], TWO, len(audio))
    assert out["usage"]["input_tokens"] == len(TWO) and out["usage"]["output_tokens"] > 0


def test_timestamps_asked_where_they_cannot_be_given_are_a_400_naming_the_field(stack):
    url = f"{stack.url}/api/v1/audio/speech"
    # word timings need an aligner this frontend was not started with (the service's rule: --aligner)
    _error(httpx.post(url, json=_pai_body(stack, text="你好。", word_timestamp_enabled=True), timeout=60), 400,
           "invalid_request_error", "--aligner")
    body = {"model": "tts-1", "voice": stack.ref, "input": "你好。", "stream_format": "sse",
            "word_timestamp_enabled": True}
    _error(httpx.post(f"{stack.url}/v1/audio/speech", json=body, timeout=60), 400, "invalid_request_error",
           "--aligner")
    _error(httpx.post(url, json=_pai_body(stack, sentence_timestamp_enabled="sometimes"), timeout=60), 400,
           "invalid_request_error", "sentence_timestamp_enabled")
    _error(httpx.post(f"{stack.url}/v1/audio/speech", json={**body, "word_timestamp_enabled": [1]}, timeout=60),
           400, "invalid_request_error", "word_timestamp_enabled")
    both = _pai_body(stack, sentence_timestamp_enabled=True)
    both["sentence_timestamp_enabled"] = False  # the earlier top-level layout, disagreeing
    _error(httpx.post(url, json=both, timeout=60), 400, "invalid_request_error", "sentence_timestamp_enabled")
