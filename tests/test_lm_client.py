"""The frontend's LM client against things that are not a working backend: clear errors, no hangs."""
from __future__ import annotations

import dataclasses
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import torch
from servers import free_port

from cosy.lm.pool import BackendPool
from cosy.lm.remote import BackendError, BackendUnavailable, RemoteLM, encode_prompt_embeds


class _FakeFrontend(BaseHTTPRequestHandler):
    """Answers like a Gradio app: an HTML page at /, 404 elsewhere."""

    def do_GET(self):
        if self.path == "/":
            body = b"<html><head><script>window.gradio_config = {}</script></head></html>"
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
        else:
            body = b'{"detail":"Not Found"}'
            self.send_response(404)
            self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_POST = do_GET

    def log_message(self, *args):
        pass


@pytest.fixture
def http_page():
    server = ThreadingHTTPServer(("127.0.0.1", free_port()), _FakeFrontend)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()


def test_unreachable_backend_is_named(tmp_path):
    url = f"http://127.0.0.1:{free_port()}/v1"
    lm = RemoteLM(url, "k", "cosyvoice2-x", connect_timeout=2, retries=1)
    with pytest.raises(BackendUnavailable, match=f"cannot reach the LM backend at {url}"):
        lm.check()
    with pytest.raises(BackendUnavailable, match="cannot reach"):
        list(lm.generate(torch.zeros(1, 3, 8), 0, 5, seed=0))


def test_url_of_a_frontend_or_without_v1_names_the_fix(http_page):
    with pytest.raises(BackendError, match="cosy frontend .*not an LM backend"):
        RemoteLM(http_page + "/v1", "k", "m").check()
    with pytest.raises(BackendError, match=f"ends in /v1: use {http_page}/v1"):
        RemoteLM(http_page, "k", "m").check()


def test_pool_with_no_live_backend_says_so():
    urls = [f"http://127.0.0.1:{free_port()}/v1" for _ in range(2)]
    pool = BackendPool([RemoteLM(u, "k", "m", connect_timeout=1, retries=0) for u in urls], cooldown=30)
    with pytest.raises(BackendUnavailable, match="no LM backend is reachable"):
        pool.check()
    with pytest.raises(BackendError, match="no LM backend could take the request"):
        list(pool.generate(torch.zeros(1, 3, 8), 0, 5, seed=0))


def test_a_down_backend_fails_requests_at_once_while_it_cools_down():
    """The first request pays the retries (0.5 + 1 s); while the backend cools down, the next ones probe it
    once, without retries: under load they must not queue behind 1.5 s each (they did: 16 requests on a
    killed backend took 59 s to fail)."""
    import time
    pool = BackendPool([RemoteLM(f"http://127.0.0.1:{free_port()}/v1", "k", "m", connect_timeout=1, retries=2)],
                       cooldown=30)
    took = []
    for _ in range(3):
        start = time.monotonic()
        with pytest.raises(BackendError, match="no LM backend could take the request: cannot reach"):
            list(pool.generate(torch.zeros(1, 3, 8), 0, 5, seed=0))
        took.append(time.monotonic() - start)
    assert took[0] >= 1.5 and max(took[1:]) < 0.5, took


def test_one_probe_at_a_time_while_the_backend_cools_down():
    """A frozen backend (accepts, never answers): once it is marked dead, one request probes it (and waits
    out the stall timeout) while the others fail at once instead of each waiting as long."""
    import socket
    import time
    frozen = socket.socket()
    frozen.bind(("127.0.0.1", 0))
    frozen.listen(16)
    url = f"http://127.0.0.1:{frozen.getsockname()[1]}/v1"
    pool = BackendPool([RemoteLM(url, "k", "m", stall_timeout=1.5, retries=2)], cooldown=30)
    x = torch.zeros(1, 3, 8)
    try:
        with pytest.raises(BackendError, match="stalled"):
            list(pool.generate(x, 0, 5, seed=0))  # marks it dead
        probe_error: list[str] = []

        def probe():
            try:
                list(pool.generate(x, 0, 5, seed=0))
            except BackendError as e:
                probe_error.append(str(e))

        t = threading.Thread(target=probe)
        t.start()
        deadline = time.monotonic() + 5
        while not pool.probing and time.monotonic() < deadline:
            time.sleep(0.01)
        start = time.monotonic()
        with pytest.raises(BackendError, match="no LM backend could take the request: .*stalled"):
            list(pool.generate(x, 0, 5, seed=0))
        assert time.monotonic() - start < 0.5
        t.join(10)
        assert probe_error and "stalled" in probe_error[0] and not pool.probing
    finally:
        frozen.close()


def test_prompt_embeds_encoding_round_trips():
    import base64
    import io
    x = torch.randn(1, 7, 16)
    back = torch.load(io.BytesIO(base64.b64decode(encode_prompt_embeds(x))), weights_only=True)
    assert back.shape == (7, 16) and torch.equal(back, x[0])


# ---- against the real backend (tests/conftest.py `backend`: vLLM on the tiny model) ---------------------

ZS_TEXT = "希望你以后能够做的比我还好呦。"


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    from cosy.lm.model import SpeechLM
    from cosy.lm.prompt import PromptEmbedder
    return SpeechLM.from_model_dir(tiny_model_dir), PromptEmbedder.from_model_dir(tiny_model_dir)


def test_client_greedy_equals_embedded_and_checks_pass(backend, tiny):
    from cosy.lm.sampling import SamplingParams
    lm, embedder = tiny
    remote = RemoteLM(backend.url, backend.api_key, backend.model_name)
    remote.check()
    x = embedder([100, 200, 300, 400], [7, 8], [11, 12, 13])
    assert torch.equal(x, lm.prompt_embeds([100, 200, 300, 400], [7, 8], [11, 12, 13]))
    greedy = SamplingParams(greedy=True)
    ours = list(lm.generate(x, 8, 60, params=greedy))
    theirs = list(remote.generate(x, 8, 60, seed=0, params=greedy))
    assert ours == theirs and len(ours) >= 8
    sampled = list(remote.generate(x, 8, 60, seed=123))  # RAS on the server, seeded
    assert sampled == list(remote.generate(x, 8, 60, seed=123)) and all(0 <= t < 6561 for t in sampled)


def test_bad_key_and_other_llm_are_clear_errors(backend):
    with pytest.raises(BackendError, match="refused the API key \\(401\\)"):
        RemoteLM(backend.url, "wrong-key", backend.model_name).check()
    with pytest.raises(BackendError, match="serves cosyvoice2-.* but this frontend's llm.pt is cosyvoice2-0000"):
        RemoteLM(backend.url, backend.api_key, "cosyvoice2-0000000000000000").check()


def test_pool_skips_a_dead_backend(backend, tiny):
    _, embedder = tiny
    dead = RemoteLM(f"http://127.0.0.1:{free_port()}/v1", backend.api_key, backend.model_name, retries=0)
    live = RemoteLM(backend.url, backend.api_key, backend.model_name)
    pool = BackendPool([dead, live], cooldown=60)
    pool.check()  # one live backend is enough; the dead one is marked
    assert pool.dead_until[id(dead)] > 0 and pool.dead_until[id(live)] == 0
    x = embedder([100, 200], [], [])
    for seed in range(3):
        assert len(list(pool.generate(x, 2, 10, seed=seed))) > 0
    assert pool.in_flight == {id(dead): 0, id(live): 0}


def test_backend_killed_mid_stream_then_restarted(backend, tiny):
    from cosy.lm.sampling import SamplingParams
    _, embedder = tiny
    pool = BackendPool([RemoteLM(backend.url, backend.api_key, backend.model_name, retries=1)], cooldown=1)
    x = embedder([100, 200, 300], [], [])
    long = SamplingParams(ignore_stop=True)
    tokens = pool.generate(x, 0, 30000, seed=1, params=long)  # far more than can finish before the crash
    got = [next(tokens) for _ in range(3)]
    backend.crash()
    try:
        # the connection closed (failed after N tokens), or, when the dying vLLM holds it open, the stall clock
        ended = "(failed after|before the first|stalled)"
        with pytest.raises(BackendError, match=f"LM backend at {backend.url}.*{ended}"):
            for t in tokens:
                got.append(t)
        assert 3 <= len(got) < 30000
        with pytest.raises(BackendError, match="no LM backend could take the request|cannot reach"):
            list(pool.generate(x, 0, 5, seed=1))
    finally:
        backend.start()
    assert len(list(pool.generate(x, 0, 5, seed=1, params=long))) == 5  # same pool, no frontend restart


def test_cli_with_backend_writes_the_embedded_lms_audio(backend, tiny_model_dir, tmp_path):
    import subprocess
    import sys

    import soundfile as sf
    from conftest import ASSETS
    common = ["--model_dir", str(tiny_model_dir), "--mode", "zero_shot", "--text", "你好，今天天气很好。",
              "--prompt_text", ZS_TEXT, "--prompt_wav", str(ASSETS / "zero_shot_prompt.wav"), "--seed", "4",
              "--greedy"]
    outs = []
    for extra in ([], ["--llm_base_url", backend.url, "--llm_api_key", backend.api_key]):
        out = tmp_path / f"{len(outs)}.wav"
        r = subprocess.run([sys.executable, "-m", "cosy", *common, *extra, "--out", str(out)], capture_output=True,
                           text=True, timeout=600)
        assert r.returncode == 0, r.stderr
        outs.append(sf.read(out)[0])
    assert len(outs[0]) > 0 and outs[0].shape == outs[1].shape and (outs[0] == outs[1]).all()
    r = subprocess.run([sys.executable, "-m", "cosy", *common, "--llm_base_url", backend.url, "--llm_api_key",
                        "nope", "--out", str(tmp_path / "x.wav")], capture_output=True, text=True, timeout=600)
    assert r.returncode == 2 and "refused the API key (401)" in r.stderr and "Traceback" not in r.stderr


def test_a_token_stream_collected_inside_the_pools_lock_does_not_deadlock():
    """A token stream dropped unclosed in a reference cycle (as an interrupted job leaves one) is closed by
    the garbage collector, at any allocation: also inside the pool's own locked `_pick`, on the same thread.
    Its `finally` takes the pool's lock to count the request out; with a plain lock that waited for ever.
    The collection lands at each allocation of `_pick`."""
    from conftest import finalizers_inside
    pool = BackendPool([RemoteLM(f"http://127.0.0.1:{free_port()}/v1", "k", "m")])
    backend = id(pool.backends[0])

    def garbage_stream() -> None:
        tokens = pool._stream(lambda b, retries: (t for t in (1, 2, 3)))
        assert next(tokens) == 1  # in flight on the backend
        holder: list = [tokens]
        holder.append(holder)  # only the collector closes it

    picks = []  # a new request's pick each time, where the collection lands
    assert finalizers_inside(garbage_stream, lambda: picks.append(pool._pick(set())), within=30), \
        "a stream's finally waited on the pool's lock held by its own thread"
    assert len(picks) == 29 and pool.in_flight[backend] == len(picks)  # every collected stream counted itself out


# ---- a streamed utterance's first chunk decoded apart (cosy.lm.first_chunk) ------------------------------

@pytest.mark.quick
def test_split_first_chunk_auto_means_every_backend_on_this_machine():
    from cosy.lm.first_chunk import wanted
    assert wanted("auto", "http://127.0.0.1:8000/v1") and wanted("auto", "http://localhost:8000/v1,http://[::1]:9/v1")
    assert not wanted("auto", "http://127.0.0.1:8000/v1,http://10.1.2.3:8000/v1")  # one elsewhere: off
    assert not wanted("auto", "http://no-such-host.invalid:8000/v1")  # unresolvable: not known to be here
    assert wanted("on", "http://10.1.2.3:8000/v1") and not wanted("off", "http://127.0.0.1:8000/v1")
    with pytest.raises(ValueError, match="--llm_split_first_chunk 'yes': must be one of auto, on, off"):
        wanted("yes", "http://127.0.0.1:8000/v1")


class _Noted(BackendPool):
    """A real pool that notes the token count the caller had taken whenever it opens a request."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.taken, self.opened = 0, []

    def _stream(self, call):
        self.opened.append(self.taken)
        for token in super()._stream(call):
            self.taken += 1
            yield token


def test_first_chunk_apart_is_the_same_decode_and_the_rest_opens_when_asked(backend, tiny):
    """Greedy, the two requests give the embedded LM's tokens exactly: the second request's prompt is the
    first's plus the first chunk's tokens as fed, and it still masks eos until min_len (12 > first)."""
    from cosy.lm.sampling import SamplingParams
    lm, embedder = tiny
    pool = _Noted([RemoteLM(backend.url, backend.api_key, backend.model_name)])
    pool.embed_speech = embedder.speech
    x, greedy = embedder([100, 200, 300, 400], [7, 8], [11, 12, 13]), SamplingParams(greedy=True)
    ours = list(lm.generate(x, 12, 60, params=greedy))
    tokens = pool.generate(x, 12, 60, seed=0, params=greedy, first=5)
    got = [next(tokens) for _ in range(5)]
    assert pool.opened == [0]  # the rest is not asked for yet: the backend decodes nothing more
    got += list(tokens)
    assert pool.opened == [0, 5] and got == ours and len(ours) >= 12
    assert pool.in_flight == {id(pool.backends[0]): 0}
    # seeded RAS: reproducible (both requests seeded), and no split without embed_speech or past max_len
    assert list(pool.generate(x, 8, 40, seed=3, first=5)) == list(pool.generate(x, 8, 40, seed=3, first=5))
    pool.opened.clear()
    list(pool.generate(x, 8, 5, seed=3, first=5))
    pool.embed_speech = None
    list(pool.generate(x, 8, 40, seed=3, first=5))
    assert len(pool.opened) == 2


def test_engine_streams_the_first_chunk_apart_with_the_same_audio(backend, tiny_model_dir):
    """Through the engine: greedy, the split stream's audio is the one-request stream's, bit for bit. The
    engine asks for the first chunk's token count (the prompt's pad, a hop, the look-ahead) and takes the
    token after it only once the first chunk's audio is made, so the backend idles meanwhile (sampled: the
    random tiny LM's greedy output is long silence, which the engine drops, and so takes more tokens)."""
    from conftest import ASSETS

    from cosy.pipeline.engine import Engine, SynthesisRequest
    req = SynthesisRequest(mode="zero_shot", text="今天天气很好我们一起去公园散步吧。", prompt_text=ZS_TEXT,
                           prompt_wav=str(ASSETS / "zero_shot_prompt.wav"), stream=True, greedy=True, seed=2)
    audio, log = {}, []
    for setting in ("off", "auto"):  # auto: the backend is on 127.0.0.1
        engine = Engine.from_model_dir(tiny_model_dir, llm_base_url=backend.url, llm_api_key=backend.api_key,
                                       llm_split_first_chunk=setting)
        assert engine.split_first == (setting == "auto")
        audio[setting] = torch.cat(list(engine.synthesize(req)))
    assert torch.equal(audio["off"], audio["auto"]) and audio["off"].numel() > 0

    class Logged:
        def __init__(self, lm):
            self.lm, self.sampling = lm, lm.sampling

        def generate(self, *args, **kwargs):
            log.append(("first", kwargs.get("first")))
            for token in self.lm.generate(*args, **kwargs):
                log.append("token")
                yield token

    def run(first, fn, batch=None):
        out = fn()
        log.append(("run", first))  # first: work of the first chunk (its prompt part ahead, flow, HiFT)
        return out
    engine.lm, engine.speech_runner = Logged(engine.lm), run
    list(engine.synthesize(dataclasses.replace(req, greedy=False)))
    prompt = engine.prompt_features(str(ASSETS / "zero_shot_prompt.wav")).speech_tokens.shape[1]
    need = engine.t2w.first_chunk_tokens(prompt)
    tokens = [i for i, e in enumerate(log) if e == "token"]
    first_chunk = [i for i, e in enumerate(log) if e == ("run", True)]
    assert log[0] == ("first", need) and [e for e in log if e[0] == "first"] == [log[0]]  # one sentence
    assert len(tokens) > need
    # its flow and HiFT ran after its last token and before the next one was taken
    assert max(first_chunk) < tokens[need] and len([i for i in first_chunk if tokens[need - 1] < i]) >= 2
