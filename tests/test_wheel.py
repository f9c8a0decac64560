"""The built wheel works outside the checkout: `pip wheel . --no-deps`, installed without dependencies into a
fresh venv that sees this venv's site-packages (the dependencies), then `python -m cosy` and the
`cosy-frontend` console script run from a directory outside the checkout."""
from __future__ import annotations

import os
import shutil
import site
import subprocess
import sys
import sysconfig
import threading
import time
import urllib.request
import zipfile
from pathlib import Path

import pytest
import soundfile as sf
from conftest import ASSETS
from servers import READY_APP, free_port

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def venv(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("wheel")
    # build from a copy of what the wheel is made of, so no build/ or *.egg-info lands in the checkout
    src = tmp / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    shutil.copytree(ROOT / "cosy", src / "cosy", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    dist = tmp / "dist"
    subprocess.run([sys.executable, "-m", "pip", "wheel", str(src), "--no-deps", "--no-build-isolation", "-q",
                    "-w", str(dist)], check=True, timeout=300, env=_env())
    (wheel,) = dist.glob("cosy-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for f in ("cosy/deploy/backend.py", "cosy/model/files.py", "cosy/pipeline/engine.py",
              "cosy/verify/random_model/cosyvoice2.yaml.template", "cosy/vllm_plugin/__init__.py"):
        assert f in names, f"{f} is not in the wheel"
    entry_points = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith("entry_points.txt"))).decode()
    assert "cosy = cosy.vllm_plugin:register" in entry_points and "cosy-frontend = " in entry_points

    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    py = venv / "bin" / "python"
    subprocess.run([sys.executable, "-m", "pip", "--python", str(py), "install", "-q", "--no-deps", str(wheel)],
                   check=True, timeout=300, env=_env())
    # the dependencies: this venv's site-packages as plain path lines, appended after the fresh venv's own.
    # Plain path lines do not run that dir's .pth files, so the editable install's finder stays off.
    fresh_site = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                check=True, capture_output=True, text=True).stdout.strip()
    ours = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"], *site.getsitepackages()}
    (Path(fresh_site) / "_parent_site.pth").write_text("".join(f"{p}\n" for p in sorted(ours) if os.path.isdir(p)))
    return venv


def _env() -> dict[str, str]:
    # PYTHONPATH (our worktree's cosy) must not leak into the fresh venv
    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"PYTHONUNBUFFERED": "1"}


def test_wheel_runs_cli_and_frontend_outside_checkout(venv, tiny_model_dir, tmp_path):
    py, bin_ = str(venv / "bin" / "python"), venv / "bin"
    for script in ("cosy", "cosy-frontend", "cosy-backend"):
        assert (bin_ / script).is_file(), script
    work = tmp_path / "cwd"
    work.mkdir()
    r = subprocess.run([py, "-c", "import cosy, cosy.frontend.server, cosy.deploy.backend; print(cosy.__file__)"],
                       cwd=work, env=_env(), capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert Path(r.stdout.strip()).is_relative_to(venv), f"cosy came from {r.stdout.strip()}, not the fresh venv"

    # the frontend starts (some seconds) while the CLI synthesizes
    port = free_port()
    front = subprocess.Popen([str(bin_ / "cosy-frontend"), "--model_dir", str(tiny_model_dir), "--data_dir",
                              str(tmp_path / "data"), "--port", str(port), "--host", "127.0.0.1"],
                             cwd=work, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    ready = threading.Event()

    def read() -> None:
        for line in front.stdout:
            lines.append(line)
            if line.startswith(READY_APP):
                ready.set()

    threading.Thread(target=read, daemon=True).start()
    try:
        out = work / "out.wav"
        r = subprocess.run([py, "-m", "cosy", "--model_dir", str(tiny_model_dir), "--mode", "cross_lingual",
                            "--text", "Hello there.", "--prompt_wav", str(ASSETS / "cross_lingual_prompt.wav"),
                            "--seed", "0", "--out", str(out)], cwd=work, env=_env(), capture_output=True, text=True,
                           timeout=600)
        assert r.returncode == 0, r.stderr
        wav, sr = sf.read(out)
        assert sr == 24000 and len(wav) > 0

        # the backend script runs too (it stops at the missing model dir, before vLLM is needed)
        r = subprocess.run([str(bin_ / "cosy-backend"), "--model_dir", str(work / "missing"), "--no_api_key"],
                           cwd=work, env=_env(), capture_output=True, text=True, timeout=120)
        assert r.returncode == 2 and "does not exist" in r.stderr, r.stderr

        deadline = time.monotonic() + 180
        while not ready.wait(0.5):
            assert front.poll() is None and time.monotonic() < deadline, "frontend did not start:\n" + "".join(lines)
        assert f"{READY_APP}http://127.0.0.1:{port}/\n" in lines
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=30) as resp:
            assert resp.status == 200
    finally:
        front.terminate()
        try:
            front.wait(15)
        except subprocess.TimeoutExpired:
            front.kill()
            front.wait(5)
