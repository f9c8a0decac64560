"""Device consistency without a GPU: PyTorch's `meta` device stands for the GPU (shapes only, no data), and
like CUDA it refuses math that mixes its tensors with CPU tensors ("Tensor on device cpu is not on the
expected device meta!"), so a CPU/CUDA mix like the former MelStretcher one fails here.

Why not FakeTensorMode with a fake "cuda" device: on a CPU-only torch it creates cuda:0 tensors and checks
devices in elementwise math, but plain slicing, advanced indexing and every host->device copy of such a
tensor raise "PyTorch is not linked with support for cuda devices" (tested: torch 2.13+cpu). The meta device
cannot run the whole Token2WavStream either (no generators on meta, no .cpu() of a meta tensor): the stream's
own device handling is checked on the CPU (one prompt copy per stream), its tensor code on meta.
"""
from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from cosy.pipeline.token2wav import MelStretcher, crossfade

pytestmark = pytest.mark.quick  # the inner-loop tier (`pytest -m quick`; README "Tests")


@pytest.mark.parametrize("speed", [0.8, 1.5])
def test_mel_stretcher_stays_on_the_mel_device(speed):
    s = MelStretcher(speed)
    outs = [s.push(torch.randn(1, 80, 30, device="meta")), s.push(torch.randn(1, 80, 20, device="meta"), final=True)]
    assert all(o.device.type == "meta" for o in outs)
    assert sum(o.shape[2] for o in outs) == int(50 / speed)


def test_a_cpu_device_mix_fails_on_meta():
    """What the former MelStretcher did (CPU weights times a device mel) is caught by this method."""
    mel = torch.randn(1, 80, 4, device="meta")
    with pytest.raises(RuntimeError, match="device"):
        _ = mel[:, :, torch.arange(4)] * torch.linspace(0, 1, 4)


def test_fake_cuda_cannot_slice_on_a_cpu_only_torch():
    """Why the meta device and not FakeTensorMode (see the module docstring)."""
    if torch.cuda.is_available():
        pytest.skip("a real CUDA build")
    with FakeTensorMode():
        x = torch.randn(1, 80, 4, device="cuda")
        with pytest.raises(RuntimeError, match="not linked with support for cuda"):
            _ = x[:, :, 1:]


def test_crossfade_on_device():
    head, tail = torch.randn(1, 9000, device="meta"), torch.randn(1, 4000, device="meta")
    window = torch.hamming_window(7680, periodic=False, device="meta")
    assert crossfade(head, tail, window).device.type == "meta"


def test_stream_keeps_prompt_and_window_on_the_device(tiny_model_dir, monkeypatch):
    from cosy.pipeline.token2wav import FlowPrompt, Token2Wav, load_token2wav

    t2w = load_token2wav(tiny_model_dir)
    prompt = FlowPrompt(torch.zeros(1, 10, dtype=torch.int32), torch.zeros(1, 20, 80), torch.zeros(1, 192))
    seen = []
    real_mel = Token2Wav.mel

    def spy(self, tokens, p, **kw):
        seen.append(p)
        return real_mel(self, tokens, p, **kw)

    monkeypatch.setattr(Token2Wav, "mel", spy)
    s = t2w.stream(prompt, speed=1.5, seed=0)
    s.push(list(range(80)))
    s.finish()
    assert len(seen) >= 2 and all(p is s.prompt for p in seen)  # one device copy per stream
    assert s.prompt.mel.device == t2w.device and s.window.device == t2w.device
