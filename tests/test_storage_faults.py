"""The data dir's filesystem refusing writes, for real: a small tmpfs mounted as the data dir of a real HTTP
stack (tests/http_stack.py's app, a real worker pool). A full disk answers 507 naming the cause, a data dir
made read-only mid-run 503; the server keeps serving, and nothing half-written stays in the data dir."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import httpx
import pytest
from http_stack import ZS_TEXT, ZS_WAV, _app, _serve

from cosy.deploy.data_dir import DataDir
from cosy.frontend.service import FrontendService
from cosy.service.workers import EngineSpec, WorkerPool


def _mount(*args: str) -> bool:
    return subprocess.run(["mount", *args], capture_output=True).returncode == 0


@pytest.fixture(scope="module")
def small_disk(tiny_model_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("nas")
    if os.geteuid() != 0 or not _mount("-t", "tmpfs", "-o", "size=3m", "tmpfs", str(root)):
        pytest.skip("mounting a tmpfs needs root")
    pool = WorkerPool(EngineSpec(str(tiny_model_dir)), workers=1, max_queue=4).start()
    server, thread, url = _serve(_app(FrontendService(pool, DataDir(root)), None, lambda: (True, "ok")))
    try:
        yield url, root
    finally:
        server.should_exit = True
        thread.join(10)
        pool.close()
        _mount("-o", "remount,rw", str(root))
        subprocess.run(["umount", str(root)], check=False)


def _upload(url: str, data: bytes) -> httpx.Response:
    return httpx.post(f"{url}/api/v1/audio/reference_audio", files={"file": ("p.wav", data)},
                      data={"text": ZS_TEXT}, timeout=120)


def _files(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()}


def test_a_full_disk_answers_507_and_leaves_nothing_half_written(small_disk):
    url, root = small_disk
    assert _upload(url, ZS_WAV.read_bytes()).status_code == 200  # room for one
    filler = root / "filler"
    with open(filler, "wb") as f:  # the rest of the disk, but 8 KiB
        free = os.statvfs(root).f_bavail * os.statvfs(root).f_frsize
        f.write(b"\0" * max(0, free - 8192))
    before = _files(root)
    r = _upload(url, ZS_WAV.read_bytes()[:-2000] + b"\0" * 2000)  # another audio: it must be stored anew
    assert r.status_code == 507, r.text
    err = r.json()["error"]
    assert err["type"] == "insufficient_storage" and "no space left" in err["message"], err
    assert _files(root) == before  # no temp file, no half voice
    listed = httpx.get(f"{url}/api/v1/audio/reference_audio", timeout=30)
    assert listed.status_code == 200  # still serving
    filler.unlink()
    assert _upload(url, ZS_WAV.read_bytes()[:-2000] + b"\0" * 2000).status_code == 200  # space again: stored


def test_a_read_only_data_dir_answers_503(small_disk):
    """Made read-only mid-run: writes answer 503, what only reads the data dir (a synthesis with a stored
    reference audio) is not lost."""
    url, root = small_disk
    ref = _upload(url, ZS_WAV.read_bytes()[:-6000] + b"\0" * 6000)
    assert ref.status_code == 200, ref.text
    assert _mount("-o", "remount,ro", str(root))
    try:
        before = _files(root)
        r = _upload(url, ZS_WAV.read_bytes()[:-4000] + b"\0" * 4000)
        assert r.status_code == 503 and "not writable" in r.json()["error"]["message"], r.text
        assert "retry-after" in r.headers and _files(root) == before
        speech = httpx.post(f"{url}/api/v1/audio/speech", timeout=120, json={"stream": False, "input": {
            "mode": "fast_replication", "text": "你好。", "reference_audio_id": ref.json()["id"]}})
        assert speech.status_code == 200 and speech.json()["output"]["audio"]["data"], speech.text
    finally:
        assert _mount("-o", "remount,rw", str(root))
    assert _upload(url, ZS_WAV.read_bytes()[:-4000] + b"\0" * 4000).status_code == 200
