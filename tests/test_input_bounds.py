"""Work that grows with what a client sends stays linear in it, and errors quote a bounded part of it: the
redaction every error message goes through (`cosy.errors.public_message`, in the frontend's event loop) and
the duplex text's held-back tail (`cosy.text.stream.split_tail`, in a worker, per WebSocket message)."""
from __future__ import annotations

import pytest
from conftest import assert_linear

from cosy.errors import echo, public_message
from cosy.text.stream import split_tail

pytestmark = pytest.mark.quick


def _linear(fn, make, small: int = 10_000, big: int = 100_000) -> None:
    assert_linear(fn, make, small, big)


@pytest.mark.parametrize("unit", ["a.", "a-", "a+", "x1", "/a-", "-/a", "a ", "a://", "1.2.3.4:"])
def test_public_message_is_linear(unit):
    _linear(public_message, lambda n: unit * (n // len(unit)))


def test_public_message_still_redacts_what_it_did():
    msg = public_message("backend http://10.0.0.5:8000/v1 and 10.0.0.6:8001 failed; x.http://h/p; /srv/data/a.wav")
    assert "10.0.0" not in msg and "/srv/" not in msg and msg.count("<backend>") == 3, msg
    assert public_message("use POST /api/v1/audio/speech") == "use POST /api/v1/audio/speech"


@pytest.mark.parametrize("make", [lambda n: "a" * n + "。", lambda n: " " * n + "。", lambda n: "1," * (n // 2) + "x",
                                  lambda n: "你" + " " * n])
def test_split_tail_is_linear(make):
    _linear(split_tail, make)


def test_split_tail_holds_back_the_same():
    for text, ready in (("今天是20", "今天是"), ("hello wor", "hello"), ("好的。 ", "好的。"), ("abc", ""),
                        ("", ""), ("你好 a.b", "你好"), ("a。", "a。"), ("x\u3000 12", "x")):
        assert split_tail(text) == (ready, text[len(ready):]), text


def test_echo_quotes_at_most_80_characters():
    assert echo("abc") == "'abc'" and echo(12) == "'12'"
    long = echo("x" * 10_000)
    assert long == repr("x" * 80 + "…") and len(long) == 83
