"""The typed request (cosy.pipeline.request) and the typed errors (cosy.errors) that every surface shares."""
from __future__ import annotations

import pickle

import pytest
import torch

from cosy.deploy.voices import UnknownVoice, VoiceExists
from cosy.errors import BadRequest, CosyError, JobError, error_type
from cosy.pipeline.request import SynthesisError, SynthesisRequest, as_number
from cosy.prompt.encoder import PromptFeatures

pytestmark = pytest.mark.quick  # the inner-loop tier (`pytest -m quick`; README "Tests")


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


def test_lm_budget_says_by_how_much_and_text_needs_something_to_speak():
    from cosy.pipeline.request import check_lm_budget, clean_filename, speakable

    req = SynthesisRequest(mode="voice", text="你好，世界。", prompt_text="字" * 900)
    check_lm_budget(req, 8192, prompt_speech_tokens=750)
    need = 2 + 900 + 750 + 6 * 21
    with pytest.raises(SynthesisError, match=f"need {need} tokens, but the LM takes at most 1024: shorten "
                                             f"prompt_text by at least {need - 1024} characters") as e:
        check_lm_budget(req, 1024, prompt_speech_tokens=750)
    assert e.value.status == 400
    with pytest.raises(SynthesisError, match="instruct_text is too long"):
        check_lm_budget(SynthesisRequest(mode="instruct", text="hi", instruct_text="x" * 999), 512)
    for text in ("\x00", "\u200b\u200c\u200d\ufeff", " \t\n\u3000", "\u202e"):
        with pytest.raises(SynthesisError, match="text is empty: nothing to speak"):
            SynthesisRequest(mode="zero_shot", text=text).check()
    assert speakable("a\u200bb\x00") == "ab"
    assert clean_filename("../x/my\x00voice\u202e.wav") == "myvoice.wav" and clean_filename("\x00") == "upload"


def test_a_backends_max_model_len_is_read_from_its_models_list():
    import socket
    import threading
    import time

    import uvicorn
    from fastapi import FastAPI

    from cosy.frontend.server import backend_max_model_len

    app = FastAPI()

    @app.get("/v1/models")
    def models():
        return {"data": [{"id": "other", "max_model_len": 1}, {"id": "ours", "max_model_len": 2048}]}

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True).start()
    while not server.started:
        time.sleep(0.05)
    url = f"http://127.0.0.1:{sock.getsockname()[1]}/v1"
    try:
        assert backend_max_model_len(url, "k", "ours") == 2048
        assert backend_max_model_len(url, "k", "missing") is None
        assert backend_max_model_len("http://127.0.0.1:9/v1", "k", "ours", timeout=1) is None
    finally:
        server.should_exit = True
