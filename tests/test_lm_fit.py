"""What the LM is sent fits its context, and the text frontend's work per request is bounded: in-process, with
the real tokenizer, the real wetext FSTs and a real HTTP server answering as vLLM does.

- a segment longer than one LM call can take is cut at the next-best boundary (sentence ends, commas, words,
  characters), never inside a special token; segments that fit stay the official ones;
- where no cut makes it fit, a 400 that says why; a backend's context refusal is a 400, never a 503;
- long digit runs are read without the FSTs, and a number-heavy text gives way to the process's other threads.
"""
from __future__ import annotations

import json
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from conftest import GOLDEN
from servers import free_port

from cosy.errors import CosyError
from cosy.lm.pool import BackendPool
from cosy.lm.remote import BackendError, BackendUnavailable, RemoteLM, TooLongForLM, smallest_context
from cosy.model.families.cosyvoice2 import FAMILY
from cosy.pipeline.lm_input import LMInput, fit_context, text_room
from cosy.pipeline.request import SynthesisError
from cosy.text import TextFrontend, TextTokenizer, normalize
from cosy.text.normalize import LONG_DIGITS, WetextNormalizer, read_long_digit_runs
from cosy.text.split import NoSplit, split_to_fit

pytestmark = pytest.mark.quick

COMMAS = "今天天气很好，" * 30  # 120 ids, one sentence (commas end none)
PROMPT = LMInput(list(range(10)), [1] * 87, [])  # the test voice: its transcript's 10 ids, 3.5 s of speech


@pytest.fixture(scope="module")
def frontend() -> TextFrontend:
    return TextFrontend(TextTokenizer.from_dir(GOLDEN / "tokenizer"))


@pytest.fixture(scope="module")
def length(frontend):
    return lambda s: len(frontend.encode(s))


# ---- the cut --------------------------------------------------------------------------------------------------

def test_a_long_sentence_is_cut_at_commas_into_equal_pieces(length):
    pieces = split_to_fit(COMMAS, length, 50)
    assert "".join(pieces) == COMMAS
    assert [length(p) for p in pieces] == [40, 40, 40] and all(p.endswith("，") for p in pieces)
    assert split_to_fit("你好，世界。", length, 10) == ["你好，世界。"]  # what fits is left alone


def test_sentence_ends_come_before_commas(length):
    text = "甲乙丙，丁戊己。庚辛壬，癸子丑。" * 4
    pieces = split_to_fit(text, length, 20)
    assert "".join(pieces) == text and all(p.endswith("。") for p in pieces)


def test_without_commas_words_then_characters(length):
    words = " ".join(["quick", "brown", "fox", "jumps"] * 40)
    pieces = split_to_fit(words, length, 25)
    assert "".join(pieces) == words and all(length(p) <= 25 for p in pieces) and len(pieces) > 1
    assert all(p.startswith(" ") for p in pieces[1:])  # each word whole, with its own blank (its own token)
    assert sum(length(p) for p in pieces) == length(words)  # so the ids are the sentence's
    han = "天气很好" * 50
    pieces = split_to_fit(han, length, 30)
    assert "".join(pieces) == han and all(length(p) <= 30 for p in pieces) and len(pieces) > 1


def test_a_special_token_is_never_cut(length):
    text = "[laughter]哈" * 40
    pieces = split_to_fit(text, length, 5)
    assert "".join(pieces) == text and all(length(p) <= 5 for p in pieces)
    assert all(p.count("[") == p.count("]") == p.count("[laughter]") for p in pieces)


def test_a_piece_that_cannot_be_cut_further_says_so(length):
    with pytest.raises(NoSplit) as e:
        split_to_fit("𠀀𠀀", length, 2)  # one character, three ids
    assert (e.value.unit, e.value.tokens, e.value.limit) == ("𠀀", 3, 2)


def test_a_system_prompt_begins_every_piece(frontend):
    system = "You are a helpful assistant.<|endofprompt|>"
    pieces = frontend.fit(system + COMMAS, 50)
    assert all(p.startswith(system) and len(frontend.encode(p)) <= 50 for p in pieces) and len(pieces) == 3
    assert "".join(p[len(system):] for p in pieces) == COMMAS


# ---- what the engine sends ------------------------------------------------------------------------------------

def test_segments_are_cut_to_fit_the_context_and_only_those(frontend):
    inputs = LMInput(PROMPT.prompt_text, PROMPT.prompt_speech, frontend.segments("你好。") + frontend.segments(COMMAS))
    fitted = fit_context(frontend, FAMILY, inputs, 2048)
    prompt = 2 + 10 + 87
    room = text_room(FAMILY, 2048 - prompt)
    assert room == (2048 - prompt) // 21 and len(fitted.segments) == 3
    for text, ids in fitted.segments:
        assert ids == frontend.encode(text) and prompt + len(ids) + FAMILY.length_limits(len(ids))[1] <= 2048
    assert fitted.segments[0] == inputs.segments[0]  # the short sentence as the official frontend made it
    assert "".join(t for t, _ in fitted.segments[1:]) == inputs.segments[1][0]
    assert fit_context(frontend, FAMILY, inputs, 32768) is inputs
    assert fit_context(frontend, FAMILY, inputs, None) is inputs


def test_texts_that_fit_keep_the_official_segments(frontend):
    """The golden texts: their segments with the test voice in a 2048 context are the official ones."""
    cases = json.loads((GOLDEN / "cases.json").read_text(encoding="utf-8"))["extra"]["text_normalize"]
    for case in cases:
        inputs = LMInput(PROMPT.prompt_text, PROMPT.prompt_speech, frontend.segments(case["input"]))
        assert fit_context(frontend, FAMILY, inputs, 2048) is inputs, case["input"]
        assert [ids for _, ids in inputs.segments] == case["segment_token_ids"]


def test_no_room_or_no_cut_is_a_400_that_says_why(frontend):
    text = LMInput(PROMPT.prompt_text, PROMPT.prompt_speech, frontend.segments("你好。"))
    with pytest.raises(SynthesisError, match="no room for text beside the voice prompt .* at most 100 tokens") as e:
        fit_context(frontend, FAMILY, text, 100)
    assert e.value.status == 400
    rare = LMInput(PROMPT.prompt_text, PROMPT.prompt_speech, frontend.segments("𠀀𠀀𠀀"))
    context = 2 + 10 + 87 + 2 + 40  # room for 2 ids: "𠀀" is 3
    with pytest.raises(SynthesisError, match="'𠀀' alone is 3 text tokens, .* room for 2 .* at most 141 tokens"):
        fit_context(frontend, FAMILY, rare, context)


# ---- the backend's answers ------------------------------------------------------------------------------------

class _Vllm(BaseHTTPRequestHandler):
    """/v1/models lists "ours" with max_model_len 2048; /v1/completions answers with `server.answer`."""

    def do_GET(self):
        self._send(200, {"object": "list", "data": [{"id": "ours", "object": "model", "max_model_len": 2048}]})

    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        self._send(*self.server.answer)

    def _send(self, status, body):
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@pytest.fixture
def vllm():
    server = ThreadingHTTPServer(("127.0.0.1", free_port()), _Vllm)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server, f"http://127.0.0.1:{server.server_port}/v1"
    server.shutdown()


def _refusal(message: str, status: int = 400) -> tuple[int, dict]:
    return status, {"error": {"message": message, "type": "BadRequestError", "param": None, "code": status}}


def test_a_backend_refusal_is_never_a_retry_advised_503(vllm):
    import torch
    server, url = vllm
    lm = RemoteLM(url, "k", "ours", retries=2)
    pool = BackendPool([lm])
    x = torch.zeros(1, 3, 8)
    for message in ("max_tokens=2400 cannot be greater than max_model_len=2048. Please request fewer output "
                    "tokens.", "This model's maximum context length is 2048 tokens. However, your prompt contains "
                               "2131 input tokens"):
        server.answer = _refusal(message)
        with pytest.raises(TooLongForLM, match=re.escape(message[:30])) as e:
            list(pool.generate(x, 0, 2400, seed=0))
        assert e.value.status == 400 and e.value.retry_after is None
    for status, message in ((400, "prompt_embeds: wrong hidden size"), (422, "unprocessable")):
        server.answer = _refusal(message, status)
        with pytest.raises(BackendError, match=message) as e:
            list(pool.generate(x, 0, 10, seed=0))
        assert e.value.status == 500 and not isinstance(e.value, BackendUnavailable)
    assert pool.dead_until[id(lm)] == 0  # a refused request says nothing about the backend's health
    server.answer = _refusal("slow down", 429)
    with pytest.raises(CosyError) as e:
        list(pool.generate(x, 0, 10, seed=0))
    assert e.value.status == 503  # busy: another backend, or later, may take it


def test_the_context_is_read_from_the_backend_and_asked_again_only_now_and_then(vllm):
    _, url = vllm
    assert smallest_context([RemoteLM(url, "k", "ours")]) == 2048
    down = RemoteLM(f"http://127.0.0.1:{free_port()}/v1", "k", "ours", connect_timeout=1)
    assert down.context_length() is None
    start = time.monotonic()
    assert down.context_length() is None and time.monotonic() - start < 0.01  # not asked again at once
    assert smallest_context([down, RemoteLM(url, "k", "ours")]) == 2048


# ---- bounded text work ----------------------------------------------------------------------------------------

def test_a_19000_digit_run_costs_milliseconds(frontend):
    start = time.thread_time()
    segments = frontend.normalize("1" * 19000)
    assert time.thread_time() - start < 1.0
    assert segments == [" ".join(["one"] * 19000) + "."]


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_long_runs_are_read_as_the_fsts_read_them(lang):
    """Without the FSTs for the run (no digit is left of it), with the FSTs' words (blanks aside)."""
    normalizer = WetextNormalizer()
    for n in (LONG_DIGITS, 23, 40):
        run = ("1234567890" * 4)[:n]
        for text in (run, f"号码{run}。", f"call {run} now", f"x{run}y", f"pi is 3.{run} ok"):
            assert not re.search(r"\d{2}", read_long_digit_runs(text, lang)), text
            assert normalizer(text, lang).split() == normalizer._normalize_piece(text, lang).split(), text
    assert read_long_digit_runs("1" * (LONG_DIGITS - 1), lang) == "1" * (LONG_DIGITS - 1)  # a number: the FSTs'


def test_a_number_heavy_text_gives_way_to_other_threads(monkeypatch):
    """The FSTs hold the interpreter while they run: another thread of the process (another request's audio)
    gets the few ms between two pieces, unless the normalizer pauses."""
    fst = WetextNormalizer()
    text = "123456789012345 " * 19  # one piece of 304 characters, about 0.7 s of FST time

    def others_share(free: float) -> float:
        monkeypatch.setattr(normalize, "FST_FREE_SECONDS", free)
        done, count = threading.Event(), [0]

        def count_up():
            while not done.is_set():
                count[0] += 1

        t = threading.Thread(target=count_up)
        t.start()
        start = time.monotonic()
        fst(text, "en")
        done.set()
        t.join()
        return count[0] / (time.monotonic() - start)

    assert others_share(0.0) > 5 * others_share(float("inf"))
