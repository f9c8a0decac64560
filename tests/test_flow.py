"""Flow stage (speech tokens -> mel) against the official CosyVoice2 golden outputs."""
from __future__ import annotations

import pytest
import torch
from conftest import GOLDEN, reference_entries
from safetensors.torch import load_file

from cosy.flow import EncoderConfig, EstimatorConfig, FlowConfig, FlowModel
from cosy.flow.conformer import chunk_mask, rel_shift
from cosy.flow.flow_matching import fixed_noise

pytestmark = pytest.mark.quick  # the inner-loop tier (`pytest -m quick`; README "Tests")

ATOL = 1e-4

# (case, number of tokens, streaming, finalize, expected mel shape)
CASES = [
    ("nonstream", 60, False, True, (1, 80, 120)),
    ("stream_first28", 28, True, False, (1, 80, 50)),
    ("stream_first33", 33, True, False, (1, 80, 60)),
    ("stream_true_finalize_60", 60, True, True, (1, 80, 120)),
]


def golden_config() -> FlowConfig:
    """The small flow of the golden yaml; everything not listed keeps its official value."""
    return FlowConfig(
        encoder=EncoderConfig(attention_heads=2, linear_units=128, num_blocks=2),
        estimator=EstimatorConfig(channels=(64,), attention_head_dim=32, n_blocks=1, num_mid_blocks=2, num_heads=2),
    )


def load_golden_model() -> FlowModel:
    model = FlowModel(golden_config()).eval()
    model.load_state_dict(torch.load(GOLDEN / "model" / "flow.pt", weights_only=True), strict=True)
    return model


@pytest.fixture(scope="module")
def model() -> FlowModel:
    return load_golden_model()


@pytest.fixture(scope="module")
def tensors() -> dict[str, torch.Tensor]:
    return load_file(GOLDEN / "cases.safetensors")


def run_case(model: FlowModel, t: dict[str, torch.Tensor], n: int, streaming: bool, finalize: bool) -> torch.Tensor:
    return model.inference(t["flow.token"][:, :n], t["flow.prompt_token"], t["flow.prompt_feat"],
                           t["flow.embedding"], streaming=streaming, finalize=finalize)


def test_golden_state_dict_loads_strict():
    model = load_golden_model()
    assert "decoder.rand_noise" not in model.state_dict()


@pytest.mark.parametrize("name,n,streaming,finalize,shape", CASES, ids=[c[0] for c in CASES])
def test_golden_case(model, tensors, name, n, streaming, finalize, shape):
    mel = run_case(model, tensors, n, streaming, finalize)
    ref = tensors[f"flow.{name}.mel"]
    assert tuple(mel.shape) == shape == tuple(ref.shape)
    assert mel.dtype == torch.float32
    diff = (mel - ref).abs().max().item()
    print(f"flow.{name}: max abs diff {diff:.3e}")
    assert diff <= ATOL


def test_full_size_state_dict_matches_official():
    expected = {key: (shape, dtype) for key, shape, dtype in reference_entries("flow")}
    assert len(expected) > 1000
    with torch.device("meta"):
        model = FlowModel(FlowConfig())
    got = {k: (tuple(v.shape), str(v.dtype)) for k, v in model.state_dict().items()}
    assert sorted(got) == sorted(expected)
    assert got == expected


def test_global_rng_untouched(tensors):
    before = torch.get_rng_state()
    model = load_golden_model()
    run_case(model, tensors, 28, True, False)
    assert torch.equal(torch.get_rng_state(), before)


def test_fixed_noise_equals_global_seed_draw(tensors):
    noise = fixed_noise(0, 80, 15000)
    state = torch.get_rng_state()
    try:
        torch.manual_seed(0)
        assert torch.equal(noise, torch.randn(1, 80, 15000))
    finally:
        torch.set_rng_state(state)
    assert torch.equal(noise[:, :, :200], tensors["flow.rand_noise_prefix"])


def test_repeated_calls_identical(model, tensors):
    # No per-request state: the same call twice gives bit-identical output.
    a = run_case(model, tensors, 33, True, False)
    b = run_case(model, tensors, 33, True, False)
    assert torch.equal(a, b)


@pytest.mark.parametrize("size,chunk,left", [(7, 3, -1), (50, 25, -1), (120, 50, 1), (9, 2, 0)])
def test_chunk_mask_matches_loop(size, chunk, left):
    ref = torch.zeros(size, size, dtype=torch.bool)
    for i in range(size):
        start = 0 if left < 0 else max((i // chunk - left) * chunk, 0)
        ref[i, start:min((i // chunk + 1) * chunk, size)] = True
    assert torch.equal(chunk_mask(size, chunk, left), ref)


@pytest.mark.parametrize("t", [1, 2, 5, 17])
def test_rel_shift_matches_pad_trick(t):
    x = torch.randn(2, 3, t, 2 * t - 1, generator=torch.Generator().manual_seed(t))
    # Transformer-XL shift as done in the official code.
    padded = torch.cat([torch.zeros(2, 3, t, 1), x], dim=-1).view(2, 3, 2 * t, t)
    ref = padded[:, :, 1:].reshape(2, 3, t, 2 * t - 1)[..., :t]
    assert torch.equal(rel_shift(x), ref)


def test_bfloat16_runs(tensors):
    model = load_golden_model().to(torch.bfloat16)
    mel = run_case(model, tensors, 28, True, False)
    ref = tensors["flow.stream_first28.mel"]
    assert mel.dtype == torch.float32 and mel.shape == ref.shape
    assert torch.isfinite(mel).all()
    # Loose sanity bound only: bf16 keeps ~3 significant digits through 10 Euler steps.
    assert (mel - ref).abs().max().item() < 0.5 * ref.abs().max().item()
