"""Sentence marks of duplex synthesis (`cosy.pipeline.duplex_marks`): several LM segments share one streaming
token2wav, so a boundary inside a chunk is placed from the speech tokens before it; the marks tile the audio,
index the text as the caller sent it across pieces, and change no audio sample."""
from __future__ import annotations

import pytest
import torch
from conftest import ASSETS

from cosy.pipeline.duplex_marks import DuplexMarks
from cosy.pipeline.engine import Engine
from cosy.pipeline.request import SynthesisRequest
from cosy.pipeline.speed import MelStretcher

# a number and a word cut across pieces; short sentences, as the random LM runs each to its max_len
PIECES = ["第1", "2。好", "！ Hi wor", "ld."]
# (pieces, seed, the sentences' text): the tiny CosyVoice3's LM draws a stop token bistream refuses with most
# seeds and texts (tests/test_duplex_long.py)
CASES = {"cosyvoice2": (PIECES, 4, ["第12。", "好！", "Hi world."]),
         "cosyvoice3": (["你好。 ", "2。", "Hi."], 13, ["你好。", "2。", "Hi."])}


def request(seed: int = 4, **kw) -> SynthesisRequest:
    return SynthesisRequest(mode="cross_lingual", prompt_wav=str(ASSETS / "zero_shot_prompt.wav"), duplex=True,
                            seed=seed, stream=True, **kw)


def run(engine: Engine, pieces: list[str], seed: int = 4, **kw) -> tuple[list, list]:
    """(events in order: ("chunk", tensor) or ("begin"|"end", SentenceTiming), the chunks)."""
    events, chunks = [], []
    for chunk in engine.synthesize_duplex(request(seed, **kw), iter(pieces),
                                          on_mark=lambda m: events.append((m.kind, m.sentence))):
        events.append(("chunk", chunk))
        chunks.append(chunk)
    return events, chunks


@pytest.mark.quick
@pytest.mark.parametrize("family", ["cosyvoice2", "cosyvoice3"])
def test_duplex_marks_tile_the_audio_and_index_the_text_sent(family, tiny_model_dir, tiny_cv3_model_dir):
    engine = Engine.from_model_dir(tiny_model_dir if family == "cosyvoice2" else tiny_cv3_model_dir)
    pieces, seed, texts = CASES[family]
    events, chunks = run(engine, pieces, seed)
    total = sum(c.numel() for c in chunks)
    caller = "".join(pieces)
    marks = [(kind, s) for kind, s in events if kind != "chunk"]
    # begin 0, end 0, begin 1, ...: each sentence's chunks lie between its marks and fill its samples exactly
    assert [(kind, s.index) for kind, s in marks] == [(k, i) for i in range(len(marks) // 2) for k in ("begin", "end")]
    ends = [s for kind, s in marks if kind == "end"]
    assert [s.text for s in ends] == texts
    assert all(caller[s.begin_index:s.end_index] == s.text for s in ends)  # offsets into the pieces joined
    assert ends[0].begin_sample == 0 and ends[-1].end_sample == total
    assert all(a.end_sample == b.begin_sample for a, b in zip(ends, ends[1:]))
    spoken, current = {}, None
    for kind, x in events:
        if kind == "begin":
            current = x.index
        elif kind == "end":
            current = None
        else:
            assert current is not None, "a chunk outside any sentence"
            spoken[current] = spoken.get(current, 0) + x.numel()
    assert [spoken.get(s.index, 0) for s in ends] == [s.end_sample - s.begin_sample for s in ends]
    # at speed 1 a boundary inside a stream is the first sample of the next sentence's first speech token
    per_token = engine.t2w.flow.cfg.token_mel_ratio * engine.t2w.samples_per_frame
    assert all(s.begin_sample % per_token == 0 for s in ends)
    assert ends[1].begin_sample > 0 and len(chunks) > len(ends)

    # timestamps change no audio sample, nor how it is cut into chunks
    plain = list(engine.synthesize_duplex(request(seed), iter(pieces)))
    assert len(plain) == len(chunks) and all(torch.equal(a, b) for a, b in zip(plain, chunks))


@pytest.mark.quick
@pytest.mark.parametrize("speed", [0.5, 0.8, 1.0, 1.3, 1.7, 2.0])
def test_a_boundary_frame_is_where_the_stretcher_puts_it(speed, tiny_model_dir):
    """The mel of k tokens of one sentence, then of the next, through the real streaming stretcher in uneven
    pushes: the first output frame leaning on the next sentence (its share >= 1/2) is `DuplexMarks.frame(k)`."""
    t2w = Engine.from_model_dir(tiny_model_dir).t2w
    ratio = t2w.flow.cfg.token_mel_ratio
    for k in range(1, 80, 7):
        frames = ratio * (k + 23)
        mel = (torch.arange(frames) >= ratio * k).float().view(1, 1, -1)
        stretcher, out, at = MelStretcher(speed), [], 0
        for size in (11, 3, 40, 7, frames):
            out.append(stretcher.push(mel[:, :, at:at + size], final=at + size >= frames))
            at += size
            if at >= frames:
                break
        stretched = torch.cat(out, dim=2)[0, 0]
        assert stretched.numel() == int(frames / speed)
        first = int(torch.nonzero(stretched >= 0.5)[0])
        assert DuplexMarks(t2w, speed, None).frame(k) == first, (speed, k)


@pytest.mark.quick
def test_marks_at_another_speed_still_tile_the_audio(tiny_model_dir):
    engine = Engine.from_model_dir(tiny_model_dir)
    events, chunks = run(engine, PIECES[:2], speed=1.3)
    ends = [s for kind, s in events if kind == "end"]
    assert len(ends) == 2 and ends[0].begin_sample == 0 and ends[-1].end_sample == sum(c.numel() for c in chunks)
    assert ends[0].end_sample == ends[1].begin_sample
    assert ends[1].begin_sample % engine.t2w.samples_per_frame == 0  # on a frame of the stretched mel


def test_marks_across_several_token2wav_streams(tiny_model_dir):
    """A flow noise table that holds one sentence's tokens: each sentence is a stream of its own
    (tests/test_duplex_long.py); the marks follow the streams' audio, each sentence 40 tokens of 960 samples."""
    from test_duplex_long import SAMPLES_PER_TOKEN, SENTENCES, cut_noise, frames_for

    engine = Engine.from_model_dir(tiny_model_dir)
    cut_noise(engine, frames_for(engine, 60))
    events, chunks = run(engine, SENTENCES)
    ends = [s for kind, s in events if kind == "end"]
    step = 40 * SAMPLES_PER_TOKEN
    assert [(s.begin_sample, s.end_sample) for s in ends] == [(i * step, (i + 1) * step) for i in range(3)]
    assert sum(c.numel() for c in chunks) == 3 * step
    assert [(s.begin_index, s.end_index) for s in ends] == [(0, 3), (3, 6), (6, 9)]
