"""A request's field checks quote at most ECHO_CHARS characters of the offending value (`cosy.errors.echo`): a
100,000-character seed sent through gradio or a raw API call came back whole in the 400's message."""
from __future__ import annotations

import pytest

from cosy.errors import ECHO_CHARS
from cosy.pipeline.request import (
    SynthesisError,
    SynthesisRequest,
    as_number,
    check_range,
    check_seed,
    check_speed,
)

pytestmark = pytest.mark.quick

HUGE = "9" * 50_000 + "x"  # not a number
LONG_NUMBER = "1" * 300  # a number far out of any range (a float: 1.1e299)
INFINITE = "1" * 50_000  # beyond any float: infinite


@pytest.mark.parametrize("check", [
    lambda: as_number(HUGE, "seed", int),
    lambda: as_number([HUGE], "seed", int),
    lambda: as_number(HUGE, "speed"),
    lambda: check_range(LONG_NUMBER, "seed", 0, 2**31 - 1, int),
    lambda: check_range(INFINITE, "speed", 0.5, 2.0),
    lambda: check_seed(HUGE),
    lambda: check_speed(HUGE),
    lambda: SynthesisRequest(mode=HUGE, text="hi").check(),
], ids=["as_number", "as_number_list", "as_number_float", "check_range_int", "check_range_float", "check_seed",
        "check_speed", "mode"])
def test_a_huge_value_is_quoted_clipped(check):
    with pytest.raises(SynthesisError) as e:
        check()
    message = str(e.value)
    assert len(message) < ECHO_CHARS + 120, message[:300]
    assert "999" in message or "111" in message  # the value is still named, in part


def test_a_short_value_is_quoted_whole():
    with pytest.raises(SynthesisError, match="seed must be a number, got 'abc'"):
        as_number("abc", "seed", int)
    with pytest.raises(SynthesisError, match=r"speed '9' is out of range \(0.5 to 2\)"):
        check_range("9", "speed", 0.5, 2.0)
    with pytest.raises(SynthesisError, match=r"seed -1 is out of range"):
        check_seed(-1)


def test_an_output_format_and_a_model_name_are_quoted_in_part():
    from cosy.deploy.data_dir import check_name
    from cosy.frontend.encoding import EncodingError, make_encoder
    with pytest.raises(EncodingError) as e:
        make_encoder("f" * 50_000, 24000)
    assert "unsupported output format 'fff" in str(e.value) and len(str(e.value)) < ECHO_CHARS + 100
    with pytest.raises(ValueError) as e:
        check_name("m" * 50_000)
    assert "invalid model name 'mmm" in str(e.value) and len(str(e.value)) < ECHO_CHARS + 120
