"""`python -m cosy batch` against hostile input and faults, for real (the tiny random model, real files, a real
worker pool, a small tmpfs for a full disk): a bad line is a reported bad line, every user error is a message
(never a traceback), the exit status and summary are the current manifest's, an edited line is done again,
Ctrl-C stops at once, and a failing thread or disk ends the run with the reason instead of hanging it."""
from __future__ import annotations

import errno
import json
import os
import signal
import threading
import time
from pathlib import Path

import pytest
from conftest import ASSETS, small_disk
from test_batch import TEXTS, ZS_TEXT, ZS_WAV, cosy, records, run, write_manifest

from cosy.batch.manifest import BadLine, BatchItem, read_manifest
from cosy.batch.progress import Progress
from cosy.batch.results import Result, Results

CL_WAV = ASSETS / "cross_lingual_prompt.wav"


def write_raw(path: Path, lines: list[bytes | str | dict]) -> Path:
    """A manifest of raw bytes (invalid UTF-8 included), strings and objects, one a line."""
    out = b""
    for x in lines:
        if isinstance(x, dict):
            x = json.dumps(x, ensure_ascii=False)
        out += (x.encode() if isinstance(x, str) else x) + b"\n"
    path.write_bytes(out)
    return path


def cl_line(item_id: str, text: str = TEXTS[0], **kw) -> dict:
    return {"id": item_id, "text": text, "prompt_wav": str(CL_WAV), "seed": 1, **kw}


@pytest.mark.quick
def test_hostile_manifest_lines_are_bad_lines_not_a_crash(tmp_path):
    m = write_raw(tmp_path / "m.jsonl", [
        cl_line("good1"),
        b'{"id": "u8", "text": "\xff\xfe"}',  # not UTF-8
        "[" * 1000 + "]" * 1000,  # nested 1,000 deep
        '{"id": "big", "text": "hi", "voice_id": "bob", "seed": ' + "1" * 5000 + "}",  # a 5,000-digit number
        '{"id": "fast", "text": "hi", "voice_id": "bob", "speed": ' + "9" * 400 + "}",  # beyond a float
        '{"id": "rate", "text": "hi", "voice_id": "bob", "sample_rate": 1e400}',  # infinity
        {"id": "long", "text": "hi", "prompt_wav": "a" * 5000},  # a name the filesystem refuses
        cl_line("good2"),
    ])
    got = {e.line: e for e in read_manifest(m)}
    assert isinstance(got[1], BatchItem) and isinstance(got[8], BatchItem)
    reasons = {k: e.error for k, e in got.items() if isinstance(e, BadLine)}
    assert set(reasons) == {2, 3, 4, 5, 6, 7}, reasons
    assert "line 2 is not UTF-8" in reasons[2] and got[2].id is None
    assert "line 3" in reasons[3] and "nested" in reasons[3]
    assert "line 4" in reasons[4] and "digits" in reasons[4]
    assert "speed" in reasons[5] and "out of range" in reasons[5]
    assert "sample_rate" in reasons[6] and "out of range" in reasons[6]
    assert "prompt_wav" in reasons[7] and len(reasons[7]) < 400  # the name is not echoed whole


@pytest.mark.quick
def test_an_opus_line_at_a_rate_opus_cannot_encode_is_refused_up_front(tmp_path):
    m = write_manifest(tmp_path / "m.jsonl", [
        cl_line("o1", format="opus", sample_rate=22050),
        cl_line("o2", format="opus"),  # the default rate: --sample_rate's
        cl_line("o3", format="opus", sample_rate=16000),
        cl_line("w1", format="wav", sample_rate=22050),
    ])
    at_24k = {e.id: e for e in read_manifest(m)}
    assert isinstance(at_24k["o1"], BadLine) and "opus cannot be encoded at 22050 Hz" in at_24k["o1"].error
    assert all(isinstance(at_24k[i], BatchItem) for i in ("o2", "o3", "w1"))
    at_22k = {e.id: e for e in read_manifest(m, default_rate=22050)}
    assert isinstance(at_22k["o2"], BadLine) and "22050 Hz" in at_22k["o2"].error
    assert isinstance(at_22k["o3"], BatchItem) and at_22k["w1"].sample_rate == 22050


@pytest.mark.quick
def test_a_lines_request_digest_changes_with_what_it_asks_for(tmp_path):
    prompt = tmp_path / "p.wav"
    prompt.write_bytes(CL_WAV.read_bytes())
    base = {"id": "a", "text": "你好。", "prompt_wav": "p.wav", "seed": 1}
    same = [base, {**base, "mode": "cross_lingual", "format": "wav", "speed": 1.0, "ssml": False},
            dict(reversed(list(base.items())))]
    changed = [{**base, "text": "再见。"}, {**base, "seed": 2}, {**base, "speed": 1.1}, {**base, "format": "mp3"},
               {**base, "sample_rate": 16000}, {**base, "ssml": True, "text": "<speak>你好。</speak>"},
               {**base, "mode": "instruct", "instruct_text": "慢一点"}, {**base, "voice_id": "bob", "mode": "voice"}]

    def digests(lines: list[dict]) -> list[str]:
        m = write_manifest(tmp_path / "m.jsonl", [{**x, "id": f"x{k}"} for k, x in enumerate(lines)])
        entries = read_manifest(m)
        assert all(isinstance(e, BatchItem) for e in entries), entries
        return [e.digest for e in entries]

    first = digests(same)
    assert len(set(first)) == 1  # the same request, however it is spelled
    assert len(set(digests(changed)) | {first[0]}) == len(changed) + 1
    prompt.write_bytes(ZS_WAV.read_bytes())  # another recording under the same name
    assert digests([base]) != first[:1]


@pytest.mark.quick
def test_a_results_file_cut_mid_character_or_tampered_still_opens(tmp_path):
    ok = {"id": "a", "line": 1, "status": "ok", "seconds": 1.0, "file": "a.wav", "error": None}
    (tmp_path / "a.wav").write_bytes(b"x")
    text = (json.dumps(ok) + "\n" + json.dumps({**ok, "id": "b", "line": "2"}) + "\n"
            + json.dumps({**ok, "id": "c", "status": "maybe"}) + "\n" + "[" * 5000 + "\n").encode()
    cut = json.dumps({**ok, "id": "d", "status": "failed", "error": "语音"}, ensure_ascii=False).encode()[:-6]
    (tmp_path / "results.jsonl").write_bytes(text + cut)  # a killed run stopped inside a character
    results = Results(tmp_path).open()
    try:
        assert set(results.records) == {"a"}
    finally:
        results.close()
    assert [json.loads(x)["id"] for x in (tmp_path / "results.jsonl").read_text().splitlines()] == ["a"]


def test_exit_status_and_summary_are_the_current_manifests(tiny_model_dir, tmp_path):
    """A hostile manifest is a set of reported bad lines (no traceback); once the user fixes or removes
    them the run exits 0 with "0 failed"; an edited line is done again and the summary says so."""
    out, m = tmp_path / "out", tmp_path / "m.jsonl"
    args = ("batch", m, "--out", out, "--model_dir", tiny_model_dir, "--data_dir", tmp_path / "data",
            "--progress", "log")
    write_raw(m, [cl_line("a"), b'{"id": "u8", "text": "\xff"}', "[" * 1000, {"text": "no id", "voice_id": "x"},
                  cl_line("c", mode="singing"), cl_line("d", TEXTS[3])])
    r = run(*args)
    assert r.returncode == 1, r.stderr[-3000:]
    assert "Traceback" not in r.stderr and "terminate called" not in r.stderr, r.stderr[-3000:]
    rs = records(out)
    assert {k: v["status"] for k, v in rs.items()} == {"a": "ok", "line:2": "failed", "line:3": "failed",
                                                      "line:4": "failed", "c": "failed", "d": "ok"}
    assert "not UTF-8" in rs["line:2"]["error"] and "nested" in rs["line:3"]["error"]
    a_file = (out / "a.wav").stat()

    # fixed: the bad lines become good ones or go; "a" asks for another text now
    write_manifest(m, [cl_line("a", TEXTS[1]), cl_line("b", TEXTS[2]), cl_line("d", TEXTS[3])])
    r = run(*args)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "2 done, 0 failed, 1 done before" in r.stderr and "1 redone: its line changed" in r.stderr, r.stderr
    rs = records(out)
    assert set(rs) == {"a", "b", "d"} and all(v["status"] == "ok" for v in rs.values()), rs
    assert (out / "a.wav").stat().st_mtime_ns != a_file.st_mtime_ns
    assert len({v["request"] for v in rs.values()}) == 3

    r = run(*args)  # nothing changed: nothing done again
    assert r.returncode == 0 and "0 done, 0 failed, 3 done before" in r.stderr, r.stderr[-2000:]
    assert "redone" not in r.stderr


def test_a_full_output_folder_ends_with_a_message_not_a_traceback(tiny_model_dir, tmp_path):
    with small_disk(tmp_path / "out", "256k") as out:
        with open(out / "filler", "wb") as f:  # the disk, but 100 KiB: room for one line's audio (77 KB)
            st = os.statvfs(out)
            f.write(b"\0" * (st.f_bavail * st.f_frsize - 100 * 1024))
        m = write_manifest(tmp_path / "m.jsonl", [cl_line(f"u{k}", TEXTS[0]) for k in range(3)])
        args = ("batch", m, "--out", out, "--model_dir", tiny_model_dir, "--data_dir", tmp_path / "data",
                "--in_flight", "1", "--progress", "log")
        r = run(*args)
        assert r.returncode == 2, r.stderr[-3000:]
        assert "Traceback" not in r.stderr and "No space left" in r.stderr, r.stderr[-3000:]
        assert "run the same command again" in r.stderr
        assert sorted(p.name for p in out.iterdir()) == ["filler", "results.jsonl", "u0.wav"]  # no part file
        assert {k: v["status"] for k, v in records(out).items()} == {"u0": "ok"}
        (out / "filler").unlink()  # space again: the same command goes on
        r = run(*args)
        assert r.returncode == 0 and "1 done before" in r.stderr, r.stderr[-3000:]
        assert {k: v["status"] for k, v in records(out).items()} == {f"u{k}": "ok" for k in range(3)}


def test_ctrl_c_stops_the_lines_in_flight_at_once(tiny_model_dir, tmp_path):
    out = tmp_path / "out"
    m = write_manifest(tmp_path / "m.jsonl", [cl_line(f"u{k:03d}", TEXTS[k % len(TEXTS)]) for k in range(80)])
    p = cosy("batch", m, "--out", out, "--model_dir", tiny_model_dir, "--data_dir", tmp_path / "data",
             "--progress", "log")

    def ok() -> int:
        path = out / "results.jsonl"
        return sum('"ok"' in x for x in path.read_text().splitlines()) if path.exists() else 0

    deadline = time.monotonic() + 300
    while ok() < 3:
        assert p.poll() is None and time.monotonic() < deadline, p.stdout.read()[-3000:]
        time.sleep(0.1)
    at_signal = ok()
    p.send_signal(signal.SIGINT)
    t0 = time.monotonic()
    log = p.communicate(timeout=120)[0]
    took = time.monotonic() - t0
    assert p.returncode == 2, log[-3000:]
    assert "Traceback" not in log and "interrupted" in log and "run the same command again" in log, log[-3000:]
    # the lines in flight are cancelled, not finished; none of the queued ones starts
    assert ok() - at_signal <= 4 and took < 10, (ok(), at_signal, took, log[-2000:])
    assert not [x for x in out.iterdir() if x.name.startswith(".")]  # no part file left
    rs = records(out)  # a cancelled line is not recorded as done with the audio it had so far (none)
    assert all(r["status"] == "ok" and r["seconds"] > 0.3 for r in rs.values()), rs


# ---- in-process: the runner with a real worker pool, faults injected at the output folder's boundary ----

@pytest.fixture(scope="module")
def service(tiny_model_dir, tmp_path_factory):
    from cosy.deploy.data_dir import DataDir
    from cosy.frontend.service import FrontendService
    from cosy.service.workers import EngineSpec, WorkerPool
    pool = WorkerPool(EngineSpec(str(tiny_model_dir), max_batch=4), workers=1).start()
    try:
        yield FrontendService(pool, DataDir(tmp_path_factory.mktemp("data")))
    finally:
        pool.close()


def run_in_thread(runner, entries, progress=None, timeout: float = 120):
    """runner.run in a thread: (summary or None if it still runs after `timeout`, the thread)."""
    box = {}
    t = threading.Thread(target=lambda: box.setdefault("s", runner.run(entries, progress)), daemon=True)
    t.start()
    t.join(timeout)
    return box.get("s"), t


def batch_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("batch-")]


def test_a_prompt_that_vanishes_or_fails_fails_its_own_lines_with_their_own_paths(service, tmp_path):
    from cosy.batch.runner import BatchRunner
    gone, broken = tmp_path / "gone.wav", tmp_path / "broken.wav"
    gone.write_bytes(ZS_WAV.read_bytes())
    broken.write_bytes(b"RIFF" + os.urandom(300))
    (tmp_path / "link.wav").symlink_to(broken)  # the same file under another name
    m = write_manifest(tmp_path / "m.jsonl", [
        cl_line("ok1"), {"id": "g1", "text": TEXTS[1], "prompt_wav": "gone.wav", "prompt_text": ZS_TEXT},
        {"id": "b1", "text": TEXTS[2], "prompt_wav": "broken.wav"},
        {"id": "b2", "text": TEXTS[3], "prompt_wav": "link.wav"},
        cl_line("ok2", TEXTS[4])])
    entries = read_manifest(m)
    gone.unlink()  # after the manifest check, before its line runs
    results = Results(tmp_path / "out").open()
    summary, _ = run_in_thread(BatchRunner(service, results, in_flight=1), entries)
    results.close()
    assert summary is not None and summary.aborted is None, summary
    rs = records(tmp_path / "out")
    assert rs["ok1"]["status"] == rs["ok2"]["status"] == "ok", rs
    assert rs["g1"]["status"] == "failed" and "gone.wav" in rs["g1"]["error"], rs["g1"]
    assert "cannot write" not in rs["g1"]["error"]
    assert "broken.wav" in rs["b1"]["error"] and "link.wav" not in rs["b1"]["error"], rs["b1"]
    assert "link.wav" in rs["b2"]["error"] and "broken.wav" not in rs["b2"]["error"], rs["b2"]  # its own path
    assert summary.failed == 3 and summary.ok == 2


class FullDisk(Results):
    """Results whose appends fail as on a full disk after `room` records (the disk's answer, ENOSPC)."""

    room = 1

    def add(self, result: Result) -> None:
        if self.room <= 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        self.room -= 1
        super().add(result)


def test_a_results_append_that_fails_stops_the_run_with_the_reason(service, tmp_path):
    from cosy.batch.runner import BatchRunner
    entries = read_manifest(write_manifest(tmp_path / "m.jsonl", [cl_line(f"u{k}", TEXTS[k]) for k in range(6)]))
    results = FullDisk(tmp_path / "out").open()
    summary, thread = run_in_thread(BatchRunner(service, results, in_flight=2), entries)
    assert summary is not None, "run() did not return"
    assert summary.aborted and "No space left" in summary.aborted, summary
    assert batch_threads() == []


class BrokenProgress(Progress):
    def step(self, audio_s: float = 0.0, failed: bool = False) -> None:
        raise RuntimeError("progress broke")


def test_threads_that_die_are_reported_and_run_returns(service, tmp_path, capfd):
    from cosy.batch.runner import BatchRunner
    entries = read_manifest(write_manifest(tmp_path / "m.jsonl", [cl_line(f"u{k:02d}", TEXTS[k % 6])
                                                                  for k in range(30)]))
    results = Results(tmp_path / "out").open()
    runner = BatchRunner(service, results, in_flight=2)
    summary, thread = run_in_thread(runner, entries, BrokenProgress(len(entries), bar=False), timeout=120)
    if summary is None:
        runner.stop("test over")
    assert summary is not None, "run() blocked after its threads died"
    assert summary.aborted and "progress broke" in summary.aborted, summary
    assert "RuntimeError: progress broke" in capfd.readouterr().err  # the traceback, for the bug report
    assert batch_threads() == []
