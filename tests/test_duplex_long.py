"""A duplex utterance longer than the flow's fixed noise (`CausalConditionalCFM.rand_noise`, 15000 frames: about
300 s with the prompt) is spoken whole: `Engine.synthesize_duplex` starts a new token2wav stream at a segment
boundary before a stream could outgrow the table (as the other surfaces start one per sentence). Every flow call
runs over the prompt's and its stream's frames from frame 0 of the table, so one stream over the whole utterance
failed there with `ValueError: flow input of N frames exceeds the fixed noise`, which users saw as an
InternalError (a task may hold 20,000 characters: about 2,000 Chinese characters reach it).

The table is cut in-process (`cut_noise`, in a worker too: `WorkerPool.worker_prepare`), so a few short
sentences reach the limit; the random LM runs each sentence to its max_len, so every sentence's tokens, and so
its audio (960 samples a token at speed 1), are known from its text."""
from __future__ import annotations

import functools
import queue

import numpy as np
import pytest
import torch
from conftest import ASSETS

from cosy.pipeline.duplex import token_streams
from cosy.pipeline.engine import Engine
from cosy.pipeline.request import LM_DUPLEX_SEGMENT_TOKENS, SynthesisRequest
from cosy.pipeline.token2wav_stream import stream_room
from cosy.service.workers import EngineSpec, WorkerPool

SENTENCES = ["你好。"] * 3  # 2 text ids each: 40 speech tokens from a random LM
SAMPLES_PER_TOKEN = 960  # 2 mel frames of 480 samples


def cut_noise(engine: Engine, frames: int) -> None:
    """The CFM's fixed noise cut to its first `frames` frames (a worker prepare hook too): the limit a real model
    reaches at 15000 frames, reached by a few sentences."""
    cfm = engine.t2w.flow.decoder
    cfm.rand_noise = cfm.rand_noise[:, :, :frames].clone()


CV3_SEED = 6  # the tiny CosyVoice3's LM draws a stop token bistream refuses with most seeds (a 422)


def request(seed: int = 4, **kw) -> SynthesisRequest:
    return SynthesisRequest(mode="cross_lingual", prompt_wav=str(ASSETS / "zero_shot_prompt.wav"), duplex=True,
                            seed=seed, stream=True, **kw)


def frames_for(engine: Engine, tokens: int) -> int:
    """A noise table that holds the prompt and `tokens` speech tokens, and no more."""
    prompt = engine.prompt_features(str(ASSETS / "zero_shot_prompt.wav")).speech_tokens.shape[1]
    return (prompt + tokens) * engine.t2w.flow.cfg.token_mel_ratio


@pytest.fixture(scope="module")
def uncut(tiny_model_dir):
    """What an engine with the whole table makes of the first sentence, and of the first three (one stream)."""
    engine = Engine.from_model_dir(tiny_model_dir)
    return {n: torch.cat(list(engine.synthesize_duplex(request(), iter(SENTENCES[:n])))) for n in (1, 3)}


def test_a_long_duplex_utterance_is_spoken_whole(tiny_model_dir, uncut):
    """Three sentences of 40 tokens each past a table that holds the prompt and 60 tokens (it failed after
    the first chunks): each sentence is a stream of its own, every one's audio comes, in order."""
    assert uncut[1].numel() == 40 * SAMPLES_PER_TOKEN  # (the premise: 40 tokens a sentence)
    engine = Engine.from_model_dir(tiny_model_dir)
    cut_noise(engine, frames_for(engine, 60))
    got = torch.cat(list(engine.synthesize_duplex(request(), iter(SENTENCES))))
    assert got.numel() == 3 * 40 * SAMPLES_PER_TOKEN  # every sentence's audio
    first = 40 * SAMPLES_PER_TOKEN  # the first stream is the first sentence, as the whole table makes it
    assert torch.equal(got[:first], uncut[1])
    assert bool(torch.isfinite(got).all()) and float(got[first:].abs().max()) > 0


def test_a_stream_takes_segments_while_the_longest_still_fits(tiny_model_dir, uncut):
    """The room one stream has (`stream_room`) less the longest segment the duplex LM can make is what a
    stream may fill: past it, the stream ends after its segment. With room for the longest and 80 tokens,
    three sentences (40 + 40 + 40) are the first stream, exactly as one stream of them alone, then the fourth."""
    engine = Engine.from_model_dir(tiny_model_dir)
    longest = engine.family.length_limits(LM_DUPLEX_SEGMENT_TOKENS)[1]
    cut_noise(engine, frames_for(engine, longest + 80))
    prompt = engine.prompt_features(str(ASSETS / "zero_shot_prompt.wav")).speech_tokens.shape[1]
    assert stream_room(engine.t2w, prompt, 1.0) == longest + 80
    text = queue.Queue()
    for s in SENTENCES + ["你好。"]:
        text.put(s)
    text.put(None)
    got = torch.cat(list(engine.synthesize_duplex(request(), iter(text.get, None))))
    assert got.numel() == 4 * 40 * SAMPLES_PER_TOKEN
    assert torch.equal(got[:3 * 40 * SAMPLES_PER_TOKEN], uncut[3])


@pytest.mark.quick
def test_streams_group_segments_and_read_the_next_only_to_go_on():
    """`token_streams` on plain segments: a stream ends after the segment that takes it past `fill`; a segment is
    never split; the next segment is not read before a finished stream's tokens have all been taken."""
    read = []

    def segments():
        for i, n in enumerate([3, 2, 4, 1, 5]):
            read.append(i)
            yield i, iter(range(10 * i, 10 * i + n))
    streams = token_streams(segments(), fill=4)
    first, tokens = next(streams)
    assert first == 0 and list(tokens) == [0, 1, 2, 10, 11] and read == [0, 1]  # 3 <= 4 goes on; 5 > 4 ends
    got = [(first, list(tokens)) for first, tokens in streams]
    assert got == [(2, [20, 21, 22, 23, 30]), (4, [40, 41, 42, 43, 44])]
    assert [t for _, ts in token_streams(iter([(0, iter([1, 2]))]), fill=-1) for t in ts] == [1, 2]


def test_a_long_cosyvoice3_duplex_utterance_is_spoken_whole(tiny_cv3_model_dir):
    engine = Engine.from_model_dir(tiny_cv3_model_dir)
    cut_noise(engine, frames_for(engine, 60))
    got = torch.cat(list(engine.synthesize_duplex(request(CV3_SEED), iter(SENTENCES))))
    assert got.numel() == 3 * 40 * SAMPLES_PER_TOKEN


def test_a_long_duplex_utterance_through_a_batching_worker(tiny_model_dir):
    """The serving path: a worker that batches flow and vocoder steps (max_batch 2), its table cut likewise."""
    pool = WorkerPool(EngineSpec(str(tiny_model_dir), max_batch=2), workers=1, max_queue=4)
    probe = Engine.from_model_dir(tiny_model_dir)
    pool.worker_prepare = functools.partial(cut_noise, frames=frames_for(probe, 60))
    pool.start()
    try:
        text = queue.Queue()
        for s in SENTENCES:
            text.put(s)
        text.put(None)
        chunks = list(pool.synthesize_duplex(request(), text))
    finally:
        pool.close()
    assert sum(len(c) for c in chunks) == 3 * 40 * SAMPLES_PER_TOKEN
    assert all(c.dtype == np.float32 for c in chunks)


def test_a_causal_vocoders_table_bounds_a_stream_at_its_speed(tiny_cv3_model_dir):
    """CosyVoice3's HiFT reads its own fixed table (300 s of samples) at each sample's place in the stream, and
    a slower speed stretches the mel: the room counts that too (here the vocoder's table is the one cut)."""
    engine = Engine.from_model_dir(tiny_cv3_model_dir)
    prompt = engine.prompt_features(str(ASSETS / "zero_shot_prompt.wav")).speech_tokens.shape[1]
    flow_room = stream_room(engine.t2w, prompt, 1.0)
    engine.t2w.hift.m_source.tables.max_samples = 100 * SAMPLES_PER_TOKEN  # 100 tokens' audio at speed 1
    assert stream_room(engine.t2w, prompt, 0.5) == 50 < flow_room
    got = torch.cat(list(engine.synthesize_duplex(request(CV3_SEED, speed=0.5), iter(SENTENCES))))
    assert got.numel() == 3 * 40 * SAMPLES_PER_TOKEN * 2
