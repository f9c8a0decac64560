"""Batch subtitles (issue 55): a line's `subtitles` ("srt" | "vtt", or `--subtitles` for every line without
its own) writes ID.srt/ID.vtt beside its audio, one cue per sentence, and its record in results.jsonl carries
the sentences; for real (`python -m cosy batch`, the tiny random model, files on disk), the subtitle files
read back with pysubs2. A bad value is a bad line; a line that adds subtitles is redone, the others are not;
lines without the field keep their request digest and their record's shape."""
from __future__ import annotations

import json

import pysubs2
import pytest
import soundfile as sf
from test_batch import CL_WAV, records, run, write_manifest

from cosy.batch.manifest import BadLine, BatchItem, read_manifest

RECORD_KEYS = {"id", "line", "status", "seconds", "file", "error", "request"}  # a record without subtitles
TWO_SENTENCES = '<speak>你好，朋友。<break time="400ms"/>明天见！</speak>'


@pytest.mark.quick
def test_subtitles_field_is_checked_and_the_batch_default_fills_lines_without_one(tmp_path):
    plain = {"id": "a", "text": "你好。", "voice_id": "bob", "seed": 3}
    m = write_manifest(tmp_path / "m.jsonl", [
        plain,
        {**plain, "id": "b", "subtitles": "srt"},
        {**plain, "id": "c", "subtitles": "ass"},
        {**plain, "id": "d", "subtitles": True},
        {**plain, "id": "e", "subtitles": None},
    ])
    a, b, c, d, e = read_manifest(m)
    assert isinstance(a, BatchItem) and a.subtitles is None
    assert a.digest == "ba5837a031c6ad8b"  # as before the field existed: results recorded then stay valid
    assert b.subtitles == "srt" and b.subtitle_name == "b.srt" and b.digest != a.digest
    for bad, shown in ((c, "'ass'"), (d, "True")):
        assert isinstance(bad, BadLine) and f"subtitles {shown}" in bad.error and "srt, vtt" in bad.error
    assert e.subtitles is None and e.digest == a.digest  # null: not asked
    # --subtitles vtt: every line without its own
    a2, b2, *_, e2 = read_manifest(m, subtitles="vtt")
    assert (a2.subtitles, a2.subtitle_name, b2.subtitles, e2.subtitles) == ("vtt", "a.vtt", "srt", "vtt")
    assert a2.digest != a.digest and b2.digest == b.digest


def _check_subtitles(out, record: dict, fmt: str) -> list[pysubs2.SSAEvent]:
    """The line's subtitle file read back: one cue per sentence of its record, the last ending with the audio."""
    assert record["status"] == "ok" and record["subtitles"] == f"{record['id']}.{fmt}"
    cues = pysubs2.load(str(out / record["subtitles"]))
    sentences = record["sentences"]
    assert sentences and [(c.start, c.end, c.plaintext) for c in cues] == [
        (s["begin_time"], s["end_time"], s["text"]) for s in sentences]
    info = sf.info(str(out / record["file"]))
    assert cues[0].start == 0 and abs(cues[-1].end - info.frames * 1000 / info.samplerate) <= 1
    assert abs(record["seconds"] * 1000 - cues[-1].end) <= 1
    return cues


def test_batch_writes_a_subtitle_file_per_line_that_matches_its_audio(tiny_model_dir, tmp_path):
    voice = {"prompt_wav": str(CL_WAV), "mode": "cross_lingual"}
    lines = [
        {"id": "a", "text": TWO_SENTENCES, "ssml": True, "seed": 1, "subtitles": "srt", **voice},
        {"id": "b", "text": "Hello there.", "seed": 2, "subtitles": "vtt", "sample_rate": 16000, **voice},
        {"id": "c", "text": "明天见！", "seed": 3, **voice},
        {"id": "d", "text": "明天见！", "seed": 4, "subtitles": "ass", **voice},
    ]
    m = write_manifest(tmp_path / "m.jsonl", lines)
    out = tmp_path / "out"
    args = ("batch", m, "--out", out, "--model_dir", tiny_model_dir, "--max_batch", "4", "--progress", "log")
    first = run(*args)
    assert first.returncode == 1, first.stderr[-3000:]  # d is a bad line
    rs = records(out)
    cues = _check_subtitles(out, rs["a"], "srt")
    assert [c.plaintext for c in cues] == ["你好，朋友。", "明天见！"]
    assert cues[1].start - cues[0].end in (399, 400, 401)  # the break: a gap between the cues
    _check_subtitles(out, rs["b"], "vtt")
    assert set(rs["c"]) == RECORD_KEYS and rs["c"]["status"] == "ok"  # not asked: the record as it always was
    assert rs["d"]["status"] == "failed" and "subtitles 'ass'" in rs["d"]["error"]
    assert sorted(p.name for p in out.iterdir()) == ["a.srt", "a.wav", "b.vtt", "b.wav", "c.wav", "results.jsonl"]
    kept = {n: (out / n).stat().st_mtime_ns for n in ("a.srt", "a.wav")}

    # c asks for subtitles now: it is redone; a new line without the field takes --subtitles; b's subtitle file
    # was deleted: b is made again; a stays as it was
    (out / "b.vtt").unlink()
    lines[2]["subtitles"] = "srt"
    lines.append({"id": "e", "text": "你好。", "seed": 5, **voice})
    write_manifest(m, lines)
    second = run(*args, "--subtitles", "vtt")
    assert second.returncode == 1 and "3 done, 1 failed, 1 done before, 1 redone" in second.stderr, \
        second.stderr[-3000:]
    rs = records(out)
    _check_subtitles(out, rs["c"], "srt")
    _check_subtitles(out, rs["e"], "vtt")
    _check_subtitles(out, rs["b"], "vtt")
    assert {n: (out / n).stat().st_mtime_ns for n in kept} == kept
    assert sorted(p.name for p in out.iterdir()) == ["a.srt", "a.wav", "b.vtt", "b.wav", "c.srt", "c.wav", "e.vtt",
                                                     "e.wav", "results.jsonl"]
    assert all(json.loads(x) for x in (out / "results.jsonl").read_text(encoding="utf-8").splitlines())
