"""Subtitles from sentence timings (issue 55): SRT and WebVTT through pysubs2, read back by it with the times
and the caller's text of each sentence; `python -m cosy --subtitles` writes them beside --out (an SSML break
is the gap between two cues, exactly), and a path of another kind is a usage error naming the flag."""
from __future__ import annotations

import pysubs2
import pytest
import soundfile as sf
from conftest import ASSETS

from cosy.__main__ import main
from cosy.pipeline.subtitles import subtitle_format, subtitles
from cosy.pipeline.timing import SentenceTiming

pytestmark = pytest.mark.quick


@pytest.mark.parametrize("fmt", ["srt", "vtt"])
def test_one_cue_per_sentence_read_back(fmt):
    sentences = [SentenceTiming(0, "今天是2024年5月20日。", 0, 14, 0, 30012, 24000),
                 SentenceTiming(1, "It costs $5 <now> & then.\n\nNext line.", 15, 52, 36000, 60000, 24000)]
    written = subtitles(sentences, fmt)
    cues = pysubs2.SSAFile.from_string(written)
    assert [(c.start, c.end) for c in cues] == [(s.begin_time, s.end_time) for s in sentences] == [(0, 1250),
                                                                                                 (1500, 2500)]
    assert cues[0].plaintext == "今天是2024年5月20日。" and cues[1].plaintext.endswith(" then.\nNext line.")
    # the text as written (SRT as it is; WebVTT's reserved characters as entities), blank lines left out
    shown = "It costs $5 &lt;now&gt; &amp; then." if fmt == "vtt" else "It costs $5 <now> & then."
    assert f"{shown}\nNext line.\n" in written
    assert subtitle_format("a/b.SRT") == "srt" and subtitle_format("x.vtt") == "vtt"
    with pytest.raises(ValueError, match="end it in .srt or .vtt"):
        subtitle_format("x.txt")


def _cli(model_dir, out, *args: str) -> list[str]:
    return ["--model_dir", str(model_dir), "--mode", "cross_lingual", "--prompt_wav",
            str(ASSETS / "cross_lingual_prompt.wav"), "--seed", "1", "--out", str(out), *args]


def test_the_cli_writes_subtitles_that_match_its_audio(tiny_model_dir, tmp_path):
    out, srt = tmp_path / "out.wav", tmp_path / "out.srt"
    doc = '<speak>你好，朋友。<break time="400ms"/>明天见！</speak>'
    assert main(_cli(tiny_model_dir, out, "--ssml", "--text", doc, "--subtitles", str(srt))) == 0
    cues = pysubs2.load(str(srt))
    ms = round(sf.info(str(out)).frames * 1000 / 24000)
    assert [c.plaintext for c in cues] == ["你好，朋友。", "明天见！"]
    assert cues[0].start == 0 and cues[1].end == ms and cues[0].end < cues[1].start
    assert cues[1].start - cues[0].end in (399, 400, 401)  # the break, in whole ms of rounded sample times


def test_a_subtitles_path_of_another_kind_is_a_usage_error(tiny_model_dir, tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        main(_cli(tiny_model_dir, tmp_path / "out.wav", "--text", "你好。", "--subtitles", str(tmp_path / "x.txt")))
    err = capsys.readouterr().err
    assert e.value.code == 2 and "--subtitles" in err and ".srt or .vtt" in err
    assert list(tmp_path.iterdir()) == []
