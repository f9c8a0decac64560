"""The typed request (cosy.pipeline.request) and the typed errors (cosy.errors) that every surface shares."""
from __future__ import annotations

import pickle

import pytest
import torch

from cosy.deploy.voices import UnknownVoice, VoiceExists
from cosy.errors import BadRequest, CosyError, JobError, error_type
from cosy.pipeline.request import SynthesisError, SynthesisRequest, as_number
from cosy.prompt.encoder import PromptFeatures


def test_request_crosses_the_process_hop_unchanged():
    voice = PromptFeatures(torch.arange(6, dtype=torch.int32).view(1, 6), torch.randn(1, 12, 80), torch.randn(1, 192))
    req = SynthesisRequest(mode="voice", text="你好", prompt_text="p", voice_id="alice", voice=voice, stream=True,
                           speed=1.25, seed=7)
    wire = pickle.loads(pickle.dumps(req.to_wire()))  # what a multiprocessing Pipe does
    assert not any(isinstance(v, torch.Tensor) for v in wire.values())
    back = SynthesisRequest.from_wire(wire)
    for name in ("mode", "text", "prompt_text", "voice_id", "stream", "speed", "seed", "prompt_wav"):
        assert getattr(back, name) == getattr(req, name)
    for name in ("speech_tokens", "mel", "embedding"):
        assert torch.equal(getattr(back.voice, name), getattr(req.voice, name))


@pytest.mark.parametrize("fields, words", [
    ({"mode": "sing"}, "unknown mode 'sing'"),
    ({"speed": 2.5}, "speed 2.5 is out of range (0.5 to 2.0)"),
    ({"speed": "fast"}, "speed 'fast' is out of range"),
    ({"seed": -1}, "seed -1 is out of range"),
    ({"seed": 2**31}, "seed 2147483648 is out of range"),
    ({"text": "x" * 20001}, "text is 20001 characters; the limit is 20000"),
    ({"text": 5}, "text must be a string"),
])
def test_check_names_the_field(fields, words):
    with pytest.raises(SynthesisError, match=words.replace("(", r"\(").replace(")", r"\)")) as e:
        SynthesisRequest(**{"mode": "zero_shot", **fields}).check()
    assert e.value.status == 400


def test_numbers_from_loose_surfaces():
    assert as_number(3.0, "seed", int) == 3 and isinstance(as_number(3.0, "seed", int), int)
    assert as_number("1.5", "speed") == 1.5 and as_number(None, "seed", int) is None
    for bad in ("abc", 1.5, float("nan"), True, [1]):
        with pytest.raises(SynthesisError, match="seed must be a"):
            as_number(bad, "seed", int)


def test_errors_carry_their_status_across_the_hop():
    assert (UnknownVoice("x").status, VoiceExists("x").status, BadRequest("x").status) == (404, 409, 400)
    assert isinstance(UnknownVoice("x"), ValueError)  # old callers catching ValueError still work
    kind, message, status, retry = JobError.wire(VoiceExists("voice 'a' exists already"))
    e = JobError(kind, message, status, retry)
    assert (e.kind, e.status, str(e)) == ("VoiceExists", 409, "voice 'a' exists already")
    assert JobError.wire(KeyError("k"))[2] == 500  # a bug is ours, never the caller's
    assert isinstance(e, CosyError) and error_type(e.status) == "invalid_request_error"
    assert [error_type(s) for s in (401, 404, 429, 503, 500)] == [
        "unauthorized", "not_found", "rate_limited", "unavailable", "server_error"]
