"""`python -m cosy.golden_check`: on the official fixtures, and on other directories of the same format."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import GOLDEN
from safetensors.torch import load_file, save_file

from cosy.model.load import load_flow, load_hift

pytestmark = pytest.mark.quick  # the inner-loop tier (`pytest -m quick`; README "Tests")


def golden_check(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cosy.verify.golden_check", *map(str, args)],
                          capture_output=True, text=True, timeout=600)


def test_every_official_case_passes():
    """audio features, text, tokenizer, LM, flow and HiFT against the official outputs."""
    r = golden_check(GOLDEN)
    assert r.returncode == 0, r.stdout + r.stderr
    rows = [line for line in r.stdout.splitlines()[1:] if line.strip()]
    names = " ".join(row.split()[0] for row in rows)
    meta = json.loads((GOLDEN / "cases.json").read_text())
    for case in meta["cases"]:  # every case reported, none skipped
        assert case["name"] in names
    for row in rows:
        *_, diff, tol, result = row.split()
        assert result == "PASS" and float(diff) <= float(tol)
    # the text cases compare every input exactly (32 inputs x 3 outputs; 12 strings + len + special ids)
    assert "text.text_normalize (96/96 exact)" in r.stdout and "text.tokenizer_encode (14/14 exact)" in r.stdout


def _copy_golden(dst: Path) -> Path:
    shutil.copytree(GOLDEN, dst, ignore=shutil.ignore_patterns("tokenizer", "llm.pt", "CosyVoice-BlankEN"))
    return dst


def test_perturbed_reference_and_unknown_case_fail(tmp_path):
    d = _copy_golden(tmp_path / "g")
    tensors = load_file(d / "cases.safetensors")
    tensors["flow.stream_first28.mel"][0, 5, 7] += 1e-3  # above the 1e-4 tolerance
    save_file(tensors, d / "cases.safetensors")
    meta = json.loads((d / "cases.json").read_text())
    meta["cases"].append({"name": "flow.mystery", "producer": "something.else", "inputs": {}, "outputs": {}})
    (d / "cases.json").write_text(json.dumps(meta))
    r = golden_check(d, "--kinds", "flow")
    assert r.returncode == 1
    lines = {line.split()[0]: line for line in r.stdout.splitlines()[1:]}
    assert lines["flow.stream_first28"].endswith("FAIL") and lines["flow.nonstream"].endswith("PASS")
    assert "not understood" in r.stdout and "flow.mystery" in r.stdout


def test_any_directory_of_the_format(tmp_path, tiny_model_dir):
    """Another model (random tiny, other seed), other inputs and names: the format alone drives the check."""
    d = tmp_path / "other"
    shutil.copytree(tiny_model_dir, d / "model")
    g = torch.Generator().manual_seed(5)
    t = {"x.token": torch.randint(0, 6561, (1, 41), generator=g, dtype=torch.int32),
         "x.prompt": torch.randint(0, 6561, (1, 12), generator=g, dtype=torch.int32),
         "x.feat": torch.randn(1, 24, 80, generator=g), "x.emb": torch.randn(1, 192, generator=g),
         "x.mel": torch.randn(1, 80, 37, generator=g) - 5, "x.s": torch.randn(1, 1, 37 * 480, generator=g) * 0.1}
    flow, hift = load_flow(d / "model"), load_hift(d / "model")
    t["x.flow_out"] = flow.inference(t["x.token"][:, :30], t["x.prompt"], t["x.feat"], t["x.emb"],
                                     streaming=True, finalize=False)
    with torch.no_grad():
        t["x.f0"] = hift.predict_f0(t["x.mel"])
        t["x.speech"] = hift.decode(t["x.mel"], t["x.s"])
    save_file({k: v.contiguous() for k, v in t.items()}, d / "cases.safetensors")
    cases = [
        {"name": "flow.partial", "producer": "CausalMaskedDiffWithXvec.inference",
         "args": {"streaming": True, "finalize": False},
         "inputs": {"token": "x.token[:, :30]", "prompt_token": {"tensor": "x.prompt"},
                    "prompt_feat": {"tensor": "x.feat"}, "embedding": "x.emb"},
         "outputs": {"mel": {"tensor": "x.flow_out"}}, "suggested_tolerance": {"atol": 1e-5}},
        {"name": "hift.f0", "producer": "HiFTGenerator.f0_predictor", "inputs": {"speech_feat": "x.mel"},
         "outputs": {"f0": {"tensor": "x.f0"}}, "suggested_tolerance": {"atol": 1e-3}},
        {"name": "hift.dec", "producer": "HiFTGenerator.decode(x, s)", "inputs": {"x": "x.mel", "s": "x.s"},
         "outputs": {"speech": {"tensor": "x.speech"}}, "suggested_tolerance": {"atol": 1e-6}},
    ]
    (d / "cases.json").write_text(json.dumps({"cases": cases}))
    r = golden_check(d)
    assert r.returncode == 0, r.stdout + r.stderr
    assert [line.split()[0] for line in r.stdout.splitlines()[1:]] == ["flow.partial", "hift.f0", "hift.dec"]
    assert t["x.flow_out"].shape == (1, 80, 2 * (12 + 27) - 24)


def test_the_bistream_directory_passes_and_a_changed_official_token_fails(tmp_path):
    """golden-bistream (literal cases, model in ../golden/model): every case passes; one official token changed
    makes that case fail."""
    src = GOLDEN.parent / "golden-bistream"
    r = golden_check(src)
    rows = [line for line in r.stdout.splitlines()[1:] if line.strip()]
    cases = json.loads((src / "cases.json").read_text())["cases"]
    assert r.returncode == 0 and len(rows) == len(cases) and all(row.endswith("PASS") for row in rows), r.stdout
    meta = json.loads((src / "cases.json").read_text())
    meta["cases"][0]["bistream"]["yielded"][0] += 1
    meta["model_dir"] = str(GOLDEN / "model")
    (tmp_path / "cases.json").write_text(json.dumps(meta))
    r = golden_check(tmp_path)
    assert r.returncode == 1 and f"{cases[0]['name']} (5/6 exact)" in r.stdout and "FAIL" in r.stdout, r.stdout
