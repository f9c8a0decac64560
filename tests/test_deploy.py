"""cosy.deploy.models (model dir resolution, downloads once under a lock) and cosy.deploy.data_dir (shared
--data_dir)."""
from __future__ import annotations

import functools
import hashlib
import multiprocessing as mp
import os
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # launch/ is not installed; spawned workers import this module too
    sys.path.insert(0, str(ROOT))

from cosy.deploy.data_dir import DataDir  # noqa: E402
from cosy.deploy.models import MARKER, cache_dir, resolve_model_dir, resolve_ttsfrd_dir  # noqa: E402
from cosy.deploy.voices import VoiceError  # noqa: E402
from cosy.model.files import ALL_FILES, FLOW, HIFT, LLM, YAML, ModelDir, ModelDirError  # noqa: E402
from cosy.prompt.encoder import PromptFeatures  # noqa: E402

MODEL_ID = "iic/CosyVoice2-0.5B"


def _link_tree(src: Path, dst: Path) -> None:
    """A cheap 'download': hard links (files already there are kept, as a resuming client would)."""
    def link(s: str, d: str) -> None:
        if not os.path.exists(d):
            os.link(s, d)
    shutil.copytree(src, dst, copy_function=link, dirs_exist_ok=True)


def slow_download(src: str, counter: str, model_id: str, local_dir: Path) -> str:
    """Module level so spawned processes can unpickle it: counts itself, takes 1 s, then 'downloads'."""
    with open(counter, "a") as f:
        f.write(f"{os.getpid()}\n")
    time.sleep(1.0)
    _link_tree(Path(src), Path(local_dir))
    return "test"


def _resolve_worker(spec: str, root: str, download, barrier, queue) -> None:
    barrier.wait()  # all 8 start resolving at the same moment
    try:
        queue.put(str(resolve_model_dir(spec, Path(root), download=download, progress=False)))
    except Exception as e:  # noqa: BLE001 (reported to the parent)
        queue.put(f"error: {type(e).__name__}: {e}")


class Downloads:
    """An injected downloader that copies the tiny model and counts its calls."""

    def __init__(self, src: Path, fail_after: str | None = None, skip: str | None = None):
        self.src, self.fail_after, self.skip, self.calls = src, fail_after, skip, 0

    def __call__(self, model_id: str, local_dir: Path) -> str:
        self.calls += 1
        if self.fail_after:  # interrupted: some files written, then the connection drops
            for name in (YAML, self.fail_after):
                os.link(self.src / name, local_dir / name)
            raise ConnectionError("connection reset by peer")
        _link_tree(self.src, local_dir)
        if self.skip:
            (local_dir / self.skip).unlink()
        return "test"


# --- local directories ---------------------------------------------------------------------------------

@pytest.mark.quick
def test_local_complete_dir_resolves_to_itself(tiny_model_dir):
    assert resolve_model_dir(str(tiny_model_dir)) == tiny_model_dir


@pytest.mark.quick
def test_local_incomplete_dir_names_missing_file(tiny_model_dir, tmp_path):
    d = tmp_path / "m"
    _link_tree(tiny_model_dir, d)
    (d / FLOW).unlink()
    with pytest.raises(ModelDirError, match=FLOW) as e:
        resolve_model_dir(str(d))
    assert str(d) in str(e.value)
    with pytest.raises(ModelDirError, match="no such model directory"):
        resolve_model_dir(str(tmp_path / "absent"))


@pytest.mark.quick
def test_read_only_mount_resolves_and_loads(tiny_model_dir, tmp_path):
    d = tmp_path / "ro"
    shutil.copytree(tiny_model_dir, d)  # a real copy: chmod must not touch the shared fixture's inodes
    subprocess.run(["chmod", "-R", "a-w", str(d)], check=True)
    try:
        assert resolve_model_dir(str(d)) == d
        md = ModelDir(d)
        assert md.config is not None and md.state_dict(HIFT)
        # a read-only models root holding a finished download resolves too (no lock taken)
        root = tmp_path / "ro_root"
        _link_tree(tiny_model_dir, root / MODEL_ID)
        (root / MODEL_ID / MARKER).write_text("{}")
        subprocess.run(["chmod", "-R", "a-w", str(root)], check=True)
        assert resolve_model_dir(MODEL_ID, root, download=Downloads(tiny_model_dir)) == root / MODEL_ID
    finally:
        subprocess.run(["chmod", "-R", "u+w", str(tmp_path)], check=True)


@pytest.mark.quick
def test_cache_dir_matches_lm_export(tmp_path, monkeypatch):
    monkeypatch.setenv("COSY_CACHE", str(tmp_path / "c"))
    assert cache_dir() == tmp_path / "c" and cache_dir().is_dir()
    export = pytest.importorskip("cosy.lm.export")
    assert export.default_cache_dir() == cache_dir()


# --- hub ids ---------------------------------------------------------------------------------------

@pytest.mark.quick
def test_hub_id_downloads_once(tiny_model_dir, tmp_path):
    dl = Downloads(tiny_model_dir)
    path = resolve_model_dir(MODEL_ID, tmp_path, download=dl, progress=False)
    assert path == tmp_path / "iic" / "CosyVoice2-0.5B" and (path / MARKER).is_file()
    assert ModelDir(path).missing() == []
    assert resolve_model_dir(MODEL_ID, tmp_path, download=dl, progress=False) == path
    assert dl.calls == 1
    (path / LLM).unlink()  # someone deletes a file later: named, not silently re-downloaded
    with pytest.raises(ModelDirError, match=LLM):
        resolve_model_dir(MODEL_ID, tmp_path, download=dl, progress=False)
    assert dl.calls == 1


@pytest.mark.quick
def test_interrupted_download_leaves_nothing_then_resumes(tiny_model_dir, tmp_path):
    with pytest.raises(ModelDirError, match="could not download .*connection reset"):
        resolve_model_dir(MODEL_ID, tmp_path, download=Downloads(tiny_model_dir, fail_after=LLM), progress=False)
    target = tmp_path / "iic" / "CosyVoice2-0.5B"
    assert not target.exists()
    assert all(p.name.startswith(".") or p.suffix == ".lock" for p in target.parent.iterdir())
    dl = Downloads(tiny_model_dir)
    assert resolve_model_dir(MODEL_ID, tmp_path, download=dl, progress=False) == target
    assert dl.calls == 1 and ModelDir(target).missing() == []


@pytest.mark.quick
def test_download_lacking_a_file_is_not_published(tiny_model_dir, tmp_path):
    with pytest.raises(ModelDirError, match="campplus.onnx"):
        resolve_model_dir(MODEL_ID, tmp_path, download=Downloads(tiny_model_dir, skip="campplus.onnx"),
                          progress=False)
    assert not (tmp_path / MODEL_ID).exists()


def test_eight_processes_download_once(tiny_model_dir, tmp_path):
    counter = tmp_path / "calls.txt"
    download = functools.partial(slow_download, str(tiny_model_dir), str(counter))
    ctx = mp.get_context("spawn")
    barrier, queue = ctx.Barrier(8), ctx.Queue()
    procs = [ctx.Process(target=_resolve_worker, args=(MODEL_ID, str(tmp_path / "nas"), download, barrier, queue))
             for _ in range(8)]
    for p in procs:
        p.start()
    results = [queue.get(timeout=180) for _ in procs]
    for p in procs:
        p.join(timeout=30)
    target = str(tmp_path / "nas" / MODEL_ID)
    assert results == [target] * 8
    assert len(counter.read_text().splitlines()) == 1
    assert ModelDir(target).missing() == []


@pytest.mark.quick
def test_real_download_offline_says_how_to_point_at_a_local_dir(tmp_path):
    pytest.importorskip("modelscope")  # a test dependency: the real client's failure is what is checked
    env = {**os.environ, "MODELSCOPE_DOMAIN": "http://127.0.0.1:9", "MODELSCOPE_ENDPOINT": "http://127.0.0.1:9",
           "MODELSCOPE_REPO_TREE_PAGE_MAX_ATTEMPTS": "1", "MODELSCOPE_CACHE": str(tmp_path / "ms"),
           "HF_ENDPOINT": "http://127.0.0.1:9", "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf"),
           "PYTHONPATH": str(ROOT)}
    code = ("import sys; from pathlib import Path; from cosy.deploy.models import resolve_model_dir\n"
            "try: resolve_model_dir('iic/CosyVoice2-0.5B', Path(sys.argv[1]), progress=False)\n"
            "except Exception as e: print(type(e).__name__, e)\n")
    t0 = time.monotonic()
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "models")], env=env, capture_output=True,
                         text=True, timeout=60).stdout
    assert time.monotonic() - t0 < 30
    assert out.startswith("ModelDirError could not download iic/CosyVoice2-0.5B (offline?)"), out
    assert "ModelScope" in out and "Hugging Face" in out
    assert "--model_dir /path/to/CosyVoice2-0.5B" in out and all(f in out for f in ALL_FILES)
    assert not (tmp_path / "models" / MODEL_ID).exists()


# --- ttsfrd --------------------------------------------------------------------------------------

def _ttsfrd_zip(path: Path) -> None:
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("resource/festival/readme.txt", "x")
        z.writestr("../evil.txt", "x")  # zipfile drops '..': lands inside, never outside


@pytest.mark.quick
def test_ttsfrd_dirs(tmp_path, monkeypatch):
    monkeypatch.setenv("COSY_CACHE", str(tmp_path / "cache"))
    assert resolve_ttsfrd_dir(None) is None
    unpacked = tmp_path / "unpacked"
    (unpacked / "resource").mkdir(parents=True)
    assert resolve_ttsfrd_dir(str(unpacked)) == unpacked
    zipped = tmp_path / "zipped"  # read-only dir with only resource.zip: unpacked into the cache
    zipped.mkdir()
    _ttsfrd_zip(zipped / "resource.zip")
    zipped.chmod(0o555)
    out = resolve_ttsfrd_dir(str(zipped))
    assert out.is_relative_to(tmp_path / "cache") and (out / "resource/festival/readme.txt").is_file()
    assert not (tmp_path / "evil.txt").exists() and resolve_ttsfrd_dir(str(zipped)) == out
    with pytest.raises(ModelDirError, match="resource"):
        resolve_ttsfrd_dir(str(tmp_path / "cache"))

    def download(model_id: str, local_dir: Path) -> None:
        _ttsfrd_zip(local_dir / "resource.zip")
    path = resolve_ttsfrd_dir("iic/CosyVoice-ttsfrd", tmp_path / "models", download=download, progress=False)
    assert path == tmp_path / "models/iic/CosyVoice-ttsfrd" and (path / "resource/festival").is_dir()


# --- data dir ------------------------------------------------------------------------------------

def _features(seed: int):
    g = torch.Generator().manual_seed(seed)
    return PromptFeatures(torch.randint(0, 6561, (1, 10), generator=g, dtype=torch.int32),
                          torch.randn(1, 20, 80, generator=g), torch.randn(1, 192, generator=g))


def _save_voice_worker(root: str, voice_id: str, seed: int, barrier, queue) -> None:
    data = DataDir(root)  # every worker also creates the dirs: concurrent creation must be safe
    barrier.wait()
    try:
        data.voices.save(voice_id, f"text {seed}", _features(seed))
        queue.put(("ok", seed))
    except VoiceError as e:
        queue.put(("VoiceError", str(e)))


@pytest.mark.quick
def test_uploads_content_addressed_and_checked(tmp_path):
    data = DataDir(tmp_path / "d", max_upload_bytes=1000)
    blob = b"RIFF" + bytes(range(200))
    p = data.save_upload(blob, "../../etc/Prompt.WAV")  # the name gives only the extension
    assert p == data.uploads / f"{hashlib.sha256(blob).hexdigest()}.wav" and p.read_bytes() == blob
    assert data.save_upload(blob, "again.wav") == p and data.save_upload(blob, "C:\\x\\y.mp3") != p
    assert sorted(x.name for x in data.uploads.iterdir()) == sorted([p.name, p.with_suffix(".mp3").name])
    with pytest.raises(ValueError, match="limit is"):
        data.save_upload(b"x" * 1001, "big.wav")
    with pytest.raises(ValueError, match="empty"):
        data.save_upload(b"", "a.wav")
    for bad in ("x.exe", "wav", "a.wav/../b.sh", "", None):
        with pytest.raises(ValueError, match="unsupported upload"):
            data.save_upload(b"abc", bad)
    assert not list(tmp_path.glob("**/etc")) and not (tmp_path / "b.sh").exists()


@pytest.mark.quick
def test_upload_is_atomic(tmp_path, monkeypatch):
    data = DataDir(tmp_path)

    def crash(*args):
        raise OSError("disk full")
    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError, match="disk full"):
        data.save_upload(b"abc", "a.wav")
    assert list(data.uploads.iterdir()) == []  # neither the file nor its temporary


@pytest.mark.quick
def test_fine_tuned_models(tiny_model_dir, tmp_path):
    data = DataDir(tmp_path)
    _link_tree(tiny_model_dir, data.models_root / "ft-1")
    resolve_model_dir(MODEL_ID, data.models_root, download=Downloads(tiny_model_dir), progress=False)
    (data.models_root / "half").mkdir()
    assert data.fine_tuned_models() == ["ft-1"]  # not the hub owner dir 'iic', not the incomplete one
    assert data.fine_tuned("ft-1") == data.models_root / "ft-1"
    with pytest.raises(ModelDirError, match="available: ft-1"):
        data.fine_tuned("nope")
    with pytest.raises(ModelDirError, match=YAML):
        data.fine_tuned("half")
    for bad in ("../ft-1", ".hidden", "a/b", "a..b", ""):
        with pytest.raises(ValueError, match="invalid model name"):
            data.fine_tuned(bad)


@pytest.mark.quick
def test_voices_shared_between_processes_one_winner(tmp_path):
    root = str(tmp_path / "nas")
    ctx = mp.get_context("spawn")
    n = 3
    barrier, queue = ctx.Barrier(n), ctx.Queue()
    procs = [ctx.Process(target=_save_voice_worker, args=(root, "alice", seed, barrier, queue)) for seed in range(n)]
    for p in procs:
        p.start()
    results = [queue.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(timeout=30)
    winners = [seed for status, seed in results if status == "ok"]
    assert len(winners) == 1 and sum(status == "VoiceError" for status, _ in results) == n - 1
    a, b = DataDir(root), DataDir(root)  # two frontends on one dir see each other's voices
    voice = a.voices.load("alice")
    assert voice.prompt_text == f"text {winners[0]}"
    assert voice.features.embedding.equal(_features(winners[0]).embedding)
    b.voices.save("bob", "hi", _features(7))
    assert {v["voice_id"] for v in a.voices.list()} == {"alice", "bob"}
    with pytest.raises(VoiceError, match="exists already"):
        a.voices.save("bob", "again", _features(8))
    with pytest.raises(VoiceError, match="invalid voice id"):
        a.voices.save("../bob", "x", _features(8))
    assert sorted(p.name for p in (tmp_path / "nas" / "voices").iterdir()) == [".lock", "alice", "bob"]
