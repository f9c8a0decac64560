"""`python -m cosy batch`, for real (subprocesses, the tiny random model, files on disk): a 50-line manifest
with bad lines killed midway and resumed (every good line done exactly once, no half-written file, the bad
lines reported with their reason), the same audio as the single-utterance CLI for the same seeds. Two shards
against one vLLM backend: tests/test_batch_shards.py (with the session backends' modules)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
from conftest import ASSETS
from servers import ROOT

from cosy.batch.manifest import parse_shard, read_manifest

ZS_WAV = ASSETS / "zero_shot_prompt.wav"
CL_WAV = ASSETS / "cross_lingual_prompt.wav"
ZS_TEXT = "希望你以后能够做的比我还好呦。"
# short: a random LM speaks 20 tokens a text token
TEXTS = ["你好。", "天气好。", "去公园。", "谢谢你。", "再见。", "早上好。"]


def cosy(*args, **kw) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "cosy", *map(str, args)], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, **kw)


def run(*args, timeout: float = 600) -> subprocess.CompletedProcess:
    r = subprocess.run([sys.executable, "-m", "cosy", *map(str, args)], cwd=ROOT, capture_output=True, text=True,
                       timeout=timeout)
    return r


def write_manifest(path: Path, lines: list) -> Path:
    path.write_text("".join((x if isinstance(x, str) else json.dumps(x, ensure_ascii=False)) + "\n" for x in lines),
                    encoding="utf-8")
    return path


def records(out: Path, name: str = "results.jsonl") -> dict[str, dict]:
    rs = [json.loads(x) for x in (out / name).read_text(encoding="utf-8").splitlines()]
    return {r["id"] if r["id"] is not None else f"line:{r['line']}": r for r in rs}


@pytest.fixture(scope="module")
def data_dir(tiny_model_dir, tmp_path_factory) -> Path:
    """A data dir with the saved voice 'bob' (the CLI's --save_voice), and that run's audio for comparison."""
    data = tmp_path_factory.mktemp("data")
    r = run("--model_dir", tiny_model_dir, "--mode", "zero_shot", "--text", TEXTS[1], "--prompt_text", ZS_TEXT,
            "--prompt_wav", ZS_WAV, "--seed", "2", "--save_voice", "bob", "--data_dir", data, "--out",
            data / "cli-zs.wav")
    assert r.returncode == 0, r.stderr
    return data


@pytest.mark.quick
def test_manifest_lines_are_checked_before_any_synthesis(tmp_path):
    not_audio = tmp_path / "notes.wav"
    not_audio.write_text("not audio")
    m = write_manifest(tmp_path / "m.jsonl", [
        {"id": "a", "text": "你好", "voice_id": "bob"},
        "{not json",
        {"id": "../x", "text": "hi", "voice_id": "bob"},
        {"id": "b", "text": "hi", "voice_id": "bob", "colour": "red"},
        {"id": "c", "text": "hi"},
        {"id": "a", "text": "again", "voice_id": "bob"},
        "",
        {"id": "d", "text": "hi", "prompt_wav": "missing.wav", "prompt_text": "x"},
        {"id": "e", "text": "hi", "voice_id": "bob", "format": "pcm"},
        {"id": "f", "text": "hi", "voice_id": "bob", "sample_rate": 1000},
        {"id": "g", "text": "hi", "prompt_wav": "notes.wav", "mode": "cross_lingual", "seed": 3, "speed": 1.2},
    ])
    entries = read_manifest(m)
    got = {e.line: getattr(e, "error", None) for e in entries}
    assert got[1] is None and entries[0].request.voice_id == "bob" and entries[0].file_name == "a.wav"
    assert "line 2 is not JSON" in got[2]
    assert "id '../x' is missing or invalid" in got[3]
    assert "unknown field(s) colour" in got[4]
    assert "needs a voice" in got[5]
    assert "id 'a' repeats line 1" in got[6]
    assert 7 not in got  # blank lines are skipped, still counted
    assert "prompt_wav 'missing.wav' is not a file" in got[8]
    assert "unsupported format 'pcm'" in got[9]
    assert "sample_rate" in got[10]
    g = entries[-1]  # a file that exists: whether it decodes is for the worker to say
    assert got[11] is None and g.request.prompt_wav == not_audio and g.request.seed == 3 and g.request.speed == 1.2
    # shards: line k goes to shard k % n, so the shards of any manifest are disjoint and cover it
    shards = [[e.line for e in read_manifest(m, (i, 3))] for i in range(3)]
    assert sorted(sum(shards, [])) == sorted(got) and shards[1] == [2, 5, 8, 11]
    for bad in ("3/3", "1", "-1/2", "a/b", "0/0"):
        with pytest.raises(ValueError, match="use i/n"):
            parse_shard(bad)


def test_same_seed_same_audio_as_the_single_utterance_cli(tiny_model_dir, data_dir, tmp_path):
    voice_cli = tmp_path / "cli-voice.wav"
    cl_cli = tmp_path / "cli-cl.wav"
    for mode_args, out in ((["--mode", "voice", "--voice_id", "bob", "--text", TEXTS[2], "--seed", "5"], voice_cli),
                           (["--mode", "cross_lingual", "--prompt_wav", CL_WAV, "--text", "Hello there.", "--seed",
                             "7"], cl_cli)):
        r = run("--model_dir", tiny_model_dir, "--data_dir", data_dir, *mode_args, "--out", out)
        assert r.returncode == 0, r.stderr
    m = write_manifest(tmp_path / "m.jsonl", [
        {"id": "zs", "text": TEXTS[1], "prompt_wav": str(ZS_WAV), "prompt_text": ZS_TEXT, "seed": 2},
        {"id": "voice", "text": TEXTS[2], "voice_id": "bob", "seed": 5},
        {"id": "cl", "text": "Hello there.", "prompt_wav": str(CL_WAV), "seed": 7},
    ])
    out = tmp_path / "out"
    r = run("batch", m, "--out", out, "--model_dir", tiny_model_dir, "--data_dir", data_dir, "--max_batch", "4")
    assert r.returncode == 0, r.stderr
    for item, cli in (("zs", data_dir / "cli-zs.wav"), ("voice", voice_cli), ("cl", cl_cli)):
        want, sr = sf.read(cli, dtype="float32")
        got, sr2 = sf.read(out / f"{item}.wav", dtype="float32")
        assert sr == sr2 == 24000 and got.shape == want.shape, (item, got.shape, want.shape)
        assert np.abs(got - want).max() <= 1 / 32768, item  # 16-bit wav: the same samples
        assert records(out)[item]["seconds"] == pytest.approx(len(want) / sr, abs=1e-3)


def test_a_killed_batch_resumes_and_does_every_good_line_exactly_once(tiny_model_dir, data_dir, tmp_path):
    not_audio = tmp_path / "broken.wav"
    not_audio.write_bytes(b"RIFF" + os.urandom(200))
    lines, bad = [], {}
    for k in range(50):
        item = {"id": f"u{k:03d}", "text": TEXTS[k % len(TEXTS)], "seed": k}
        if k % 3 == 0:
            item["voice_id"] = "bob"
        else:  # one prompt file shared by many lines: its features are computed once
            item.update(prompt_wav=str(ZS_WAV), prompt_text=ZS_TEXT)
        if k % 10 == 4:
            item["format"] = "mp3"
        lines.append(item)
    for k, change, reason in ((7, {"voice_id": "nobody", "prompt_wav": None}, "unknown voice 'nobody'"),
                              (19, {"text": ""}, "text"),
                              (23, {"prompt_wav": str(not_audio)}, "broken.wav"),
                              (31, {"id": "u007"}, "repeats line 8"),
                              (42, {"mode": "singing"}, "unknown mode 'singing'")):
        lines[k] = {key: v for key, v in {**lines[k], **change}.items() if v is not None}
        bad[lines[k]["id"] if k != 31 else f"line:{k + 1}"] = reason
    lines[45] = '{"id": "u045", "text": '  # a line cut short
    bad["line:46"] = "not JSON"
    m = write_manifest(tmp_path / "m.jsonl", lines)
    good = {x["id"] for k, x in enumerate(lines) if isinstance(x, dict) and k != 31} - set(bad)
    out = tmp_path / "out"
    args = ("batch", m, "--out", out, "--model_dir", tiny_model_dir, "--data_dir", data_dir, "--max_batch", "4",
            "--progress", "log")

    first = cosy(*args)
    deadline = time.monotonic() + 300
    while not (out / "results.jsonl").exists() or sum(
            '"ok"' in x for x in (out / "results.jsonl").read_text().splitlines()) < 12:
        assert first.poll() is None and time.monotonic() < deadline, first.stdout.read()[-3000:]
        time.sleep(0.2)
    first.send_signal(signal.SIGKILL)
    first.wait()
    before = {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in out.iterdir() if not p.name.startswith(".")}
    done_before = {n.rsplit(".", 1)[0] for n in before if n != "results.jsonl"}
    assert 12 <= len(done_before) < len(good)  # killed midway

    second = cosy(*args)
    log = second.communicate(timeout=600)[0]
    assert second.returncode == 1, log[-3000:]  # some lines failed
    assert f"{len(done_before)} done before" in log, log[-2000:]
    rs = records(out)
    assert set(rs) == good | set(bad) and len(good) == 50 - len(bad)  # every line but the six bad ones
    assert {i for i, r in rs.items() if r["status"] == "ok"} == good
    for i, reason in bad.items():
        assert rs[i]["status"] == "failed" and reason in rs[i]["error"], (i, rs[i])
    files = sorted(p.name for p in out.iterdir())
    assert [f for f in files if f.startswith(".")] == []  # no part file left
    assert sorted(f for f in files if f != "results.jsonl") == sorted(rs[i]["file"] for i in good)
    for name, stat in before.items():  # what the first run finished was not made again
        if name != "results.jsonl":
            assert (out / name).stat().st_ino == stat[0] and (out / name).stat().st_mtime_ns == stat[1], name
    for i in good:
        path = out / rs[i]["file"]
        info = sf.info(str(path)) if path.suffix == ".wav" else None
        assert path.stat().st_size > 100 and (info is None or abs(info.duration - rs[i]["seconds"]) < 1e-3)
    third = run(*args)  # nothing left to do: the same failures, nothing synthesized again
    assert third.returncode == 1 and f"{len(good)} done before" in third.stderr, third.stderr[-2000:]
