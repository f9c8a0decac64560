"""HiFT vocoder against the official golden outputs, key handling and reproducibility."""
from __future__ import annotations

import pytest
import torch
from conftest import GOLDEN, reference_entries
from safetensors.torch import load_file

from cosy.hift import (
    HiFTConfig,
    HiFTGenerator,
    fold_weight_norm,
    to_legacy_names,
    to_parametrization_names,
    unfold_weight_norm,
    weight_normed_keys,
)

pytestmark = pytest.mark.quick  # the inner-loop tier (`pytest -m quick`; README "Tests")

SMALL = HiFTConfig(base_channels=64, f0_cond_channels=64)  # the golden model/cosyvoice2.yaml hift


@pytest.fixture(scope="module")
def golden_sd() -> dict[str, torch.Tensor]:
    return torch.load(GOLDEN / "model" / "hift.pt", map_location="cpu", weights_only=True)


@pytest.fixture(scope="module")
def cases() -> dict[str, torch.Tensor]:
    return load_file(GOLDEN / "cases.safetensors")


@pytest.fixture(scope="module")
def model(golden_sd) -> HiFTGenerator:
    m = HiFTGenerator(SMALL).eval()
    m.load_state_dict(fold_weight_norm(golden_sd), strict=True)
    return m


def _check(name: str, got: torch.Tensor, want: torch.Tensor, atol: float) -> None:
    assert got.shape == want.shape, (name, got.shape, want.shape)
    diff = (got - want).abs().max().item()
    print(f"{name}: max-abs diff {diff:.3g} (atol {atol:g})")
    assert diff <= atol, (name, diff)


def test_golden_checkpoint_loads_strictly(golden_sd):
    assert sum(k.endswith(".weight_g") for k in golden_sd) == 82
    m = HiFTGenerator(SMALL)
    m.load_state_dict(fold_weight_norm(golden_sd), strict=True)
    assert len(weight_normed_keys(m)) == 82
    # Unfolding our module gives back the checkpoint's exact key list and shapes (what the builder writes).
    back = unfold_weight_norm(m.state_dict(), weight_normed_keys(m), legacy=True)
    assert [(k, v.shape) for k, v in back.items()] == [(k, v.shape) for k, v in golden_sd.items()]


def test_golden_f0_predictor(model, cases):
    _check("hift.f0", model.predict_f0(cases["hift.mel"]), cases["hift.f0"], 1e-2)


def test_golden_source_and_speech_zero_noise(model, cases):
    speech, s = model.inference(cases["hift.mel"], noise=False)
    _check("hift.source_zero_noise", s, cases["hift.source_zero_noise"], 5e-3)
    _check("hift.inference_zero_noise.speech", speech, cases["hift.inference_zero_noise.speech"], 5e-4)


def test_golden_decode(model, cases):
    speech = model.decode(cases["hift.mel"], cases["hift.decode.s"])
    _check("hift.decode.speech", speech, cases["hift.decode.speech"], 2e-5)


def test_key_styles_fold_identically(golden_sd, cases):
    mel = cases["hift.mel"][:, :, :20]
    param = to_parametrization_names(golden_sd)
    assert any(".parametrizations.weight.original0" in k for k in param)
    assert to_legacy_names(param).keys() == golden_sd.keys()
    variants = [golden_sd, param] + [{"generator." + k: v for k, v in sd.items()} for sd in (golden_sd, param)]
    ref = fold_weight_norm(golden_sd)
    ref_wav = None
    for sd in variants:
        folded = fold_weight_norm(sd)
        assert folded.keys() == ref.keys()
        assert all(torch.equal(folded[k], ref[k]) for k in ref)
        m = HiFTGenerator(SMALL).eval()
        m.load_state_dict(folded, strict=True)
        wav, _ = m.inference(mel, noise=False)
        ref_wav = wav if ref_wav is None else ref_wav
        assert torch.equal(wav, ref_wav)


def test_fold_unfold_round_trip(model):
    sd = model.state_dict()
    keys = weight_normed_keys(model)
    for legacy in (True, False):
        back = fold_weight_norm(unfold_weight_norm(sd, keys, legacy=legacy))
        assert back.keys() == sd.keys()
        for k in sd:
            torch.testing.assert_close(back[k], sd[k], rtol=1e-6, atol=1e-7)


def test_fold_rejects_half_pairs(golden_sd):
    broken = dict(golden_sd)
    del broken["conv_pre.weight_v"]
    with pytest.raises(ValueError, match="conv_pre"):
        fold_weight_norm(broken)


def test_full_size_keys_match_reference():
    with torch.device("meta"):  # shapes only: skip the 20.8 M-parameter init
        m = HiFTGenerator(HiFTConfig())
    sd = unfold_weight_norm(m.state_dict(), weight_normed_keys(m), legacy=False)
    ours = [(k, tuple(v.shape), str(v.dtype)) for k, v in sd.items()]
    ref = reference_entries("hift")
    assert len(ref) == 328
    assert ours == ref  # same keys, shapes, dtypes and order


def test_generator_reproducible_and_global_rng_untouched(model, cases):
    mel = cases["hift.mel"][:, :, :30]
    state = torch.get_rng_state()
    a, sa = model.inference(mel, generator=torch.Generator().manual_seed(1))
    b, sb = model.inference(mel, generator=torch.Generator().manual_seed(1))
    c, _ = model.inference(mel, generator=torch.Generator().manual_seed(2))
    assert torch.equal(torch.get_rng_state(), state)
    assert torch.equal(a, b) and torch.equal(sa, sb)
    assert not torch.equal(a, c)
    quiet, _ = model.inference(mel, noise=False)
    assert not torch.equal(a, quiet)
    # The global RNG still drives the noise when no generator is given (official behaviour).
    torch.manual_seed(3)
    d, _ = model.inference(mel)
    torch.manual_seed(3)
    e, _ = model.inference(mel)
    assert torch.equal(d, e)


def test_cache_source_overwrites_head(model, cases):
    mel = cases["hift.mel"][:, :, :20]
    cache = torch.full((1, 1, 960), 0.05)
    speech, s = model.inference(mel, cache_source=cache, noise=False)
    assert s.shape == (1, 1, 20 * 480) and speech.shape == (1, 20 * 480)
    assert torch.equal(s[:, :, :960], cache)
    _, plain = model.inference(mel, noise=False)
    assert torch.equal(s[:, :, 960:], plain[:, :, 960:])
    assert torch.equal(speech, model.decode(mel, s))


def test_batch_matches_single(model, cases):
    mel = cases["hift.mel"][:, :, :20]
    one, _ = model.inference(mel, noise=False)
    two, s = model.inference(torch.cat([mel, mel * 0.9]), noise=False)
    assert two.shape == (2, 20 * 480) and s.shape == (2, 1, 20 * 480)
    # batch-shape rounding only; HiFT amplifies it (1.3e-5 measured on an AVX2 CPU; under 1e-5 on the AVX-512 ones):
    # the audio bound of every batched-vs-solo check (README *Batching and exactness*)
    torch.testing.assert_close(two[:1], one, rtol=0, atol=1e-4)
