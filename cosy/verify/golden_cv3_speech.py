"""Golden cases of CosyVoice3's speech half (flow, HiFT, token2wav), recomputed with our code.

Picked up by `cosy.verify.golden_cases` (every `cosy.verify.golden_*` module's `HANDLERS`, tried before the
CosyVoice2 ones). The cases run on the golden directory's `model/` through the normal loaders, so they
check what serving uses: `load_flow`, `load_hift` and `Token2Wav` with the family's stream vocoder.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch
from torch import Tensor

from cosy.hift.noise_tables import NoiseTables, linear_init, state_before_source
from cosy.model.family import import_object
from cosy.pipeline.token2wav import FlowPrompt, Token2Wav
from cosy.verify.golden_cases import GoldenModels


@torch.inference_mode()
def flow_case(g: GoldenModels, case: dict) -> dict[str, Any]:
    """mel, and the CFM's conditions and first DiT output (t = 0) when the case lists them."""
    inp, args = case["inputs"], case["args"]
    streaming, finalize = bool(args["streaming"]), bool(args["finalize"])
    token, prompt_token = g.tensor(inp["token"]), g.tensor(inp["prompt_token"])
    prompt_feat, embedding = g.tensor(inp["prompt_feat"]), g.tensor(inp["embedding"])
    out: dict[str, Any] = {"mel": g.flow.inference(token, prompt_token, prompt_feat, embedding, streaming, finalize)}
    mu, spks, cond = g.flow.conditions(token, prompt_token, prompt_feat, embedding, streaming, finalize)
    x = g.flow.decoder.rand_noise[:, :, :mu.size(2)]
    zeros = torch.zeros_like
    out["estimator_step0_out"] = g.flow.decoder.estimator(
        torch.cat([x, x]), torch.cat([mu, zeros(mu)]), torch.zeros(2), torch.cat([spks, zeros(spks)]),
        torch.cat([cond, zeros(cond)]), streaming)
    out["mu"], out["spks"] = mu, spks
    return out


@torch.inference_mode()
def hift_inference_case(g: GoldenModels, case: dict) -> dict[str, Any]:
    """f0, source and speech of one call; 'replaced by zeros' in the producer: the noise tables as zeros."""
    mel, finalize = g.tensor(case["inputs"]["speech_feat"]), bool(case["args"]["finalize"])
    speech, source = g.hift.inference(mel, finalize=finalize, noise="zeros" not in case["producer"])
    return {"f0": g.hift.predict_f0(mel, finalize), "source": source, "speech": speech}


@torch.inference_mode()
def hift_decode_case(g: GoldenModels, case: dict) -> dict[str, Any]:
    inp = case["inputs"]
    return {"speech": g.hift.decode(g.tensor(inp["x"]), g.tensor(inp["s"]), bool(case["args"]["finalize"]))}


@torch.inference_mode()
def hift_stream_case(g: GoldenModels, case: dict) -> dict[str, Any]:
    """The vocoder half of the official streaming, through our stream vocoder on the given mel prefixes."""
    mel, args = g.tensor("hift.mel"), case["args"]
    vocoder = import_object(g.model.family.stream_vocoder)(g.hift)
    chunks, done = [], 0
    for n, finalize in zip(args["accumulated_mel_frames"], args["finalize"]):
        chunks.append(vocoder.push(mel[:, :, done:n], finalize).unsqueeze(0))
        done = n
    return {"chunks": chunks}


CHUNK = 1 << 20  # table rows per step of the checksums (bounded memory)


def _sums(chunks) -> dict[str, float]:
    """Float64 sum, sum_abs, sum_sq, min, max over an iterable of tensors."""
    out = {"sum": 0.0, "sum_abs": 0.0, "sum_sq": 0.0, "min": float("inf"), "max": float("-inf")}
    for c in chunks:
        x = c.double()
        out["sum"] += x.sum().item()
        out["sum_abs"] += x.abs().sum().item()
        out["sum_sq"] += (x * x).sum().item()
        out["min"], out["max"] = min(out["min"], x.min().item()), max(out["max"], x.max().item())
    return out


def _close(ours: dict[str, float], ref: dict, label: str) -> dict[str, tuple]:
    """(ours within 1e-9 relative of the official checksum, True) per statistic: only summation order differs."""
    return {f"[{label}.{k}]": (abs(ours[k] - ref[k]) <= 1e-9 * max(1.0, abs(ref[k])), True) for k in ours if k in ref}


def _official_uv(state: Tensor, n_sines: int, max_samples: int) -> Tensor:
    """The official (unused) `uv` table: drawn after rand_ini, the whole sine table and l_linear's init."""
    g = torch.Generator()
    g.set_state(state)
    torch.rand(1, n_sines, generator=g)
    for start in range(0, max_samples, CHUNK):  # consecutive draws continue one stream
        torch.rand(1, min(CHUNK, max_samples - start), n_sines, generator=g)
    linear_init(g, 1, n_sines)
    return torch.rand(1, max_samples, 1, generator=g)


@torch.inference_mode()
def hift_noise_tables_case(g: GoldenModels, case: dict) -> dict[str, Any]:
    """The loaded vocoder's tables (generator state replayed from the yaml) equal the official ones, whole
    tables by checksum; the replayed states equal the recorded ones, for this model and the published size."""
    cfg = g.hift.cfg
    n_sines, max_samples = cfg.nb_harmonics + 1, cfg.max_seconds * cfg.sampling_rate
    n = g.tensors["hift.noise.sine_waves_prefix"].shape[1]
    tables = g.hift.m_source.tables
    out: dict[str, Any] = {"rand_ini": tables.rand_ini, "sine_waves_prefix": tables.sine_waves(n)}
    state = state_before_source(cfg)
    out["[state replayed = recorded]"] = (torch.equal(state, g.tensors["hift.noise.rng_state_before_sinegen2"]), True)
    ref = g.extra["hift_noise_tables"]
    whole = NoiseTables(state, n_sines, max_samples).sine_waves(max_samples)  # a private copy: 260 MB, freed
    out.update(_close(_sums(whole[:, i:i + CHUNK] for i in range(0, max_samples, CHUNK)),
                      ref["sine_waves"]["checksum_whole"], "sine_waves.checksum_whole"))
    del whole
    uv = _official_uv(state, n_sines, max_samples)
    out["uv_prefix"] = uv[:, :n].clone()
    out.update(_close(_sums([uv]), ref["uv"]["checksum_whole"], "uv.checksum_whole"))
    # the published size: of what the replay depends on, only the f0 predictor's width differs
    full_state = state_before_source(replace(cfg, f0_cond_channels=512))
    out["[full_size state replayed = recorded]"] = (
        torch.equal(full_state, g.tensors["full_size.hift_rng_state_before_sinegen2"]), True)
    full = NoiseTables(full_state, n_sines, max_samples)
    for name, mine in (("rand_ini", full.rand_ini), ("sine_waves_prefix", full.sine_waves(n))):
        out[f"[full_size.{name}]"] = (torch.equal(mine, g.tensors[f"full_size.hift_noise_{name}"]), True)
    return out


class _RecordingToken2Wav(Token2Wav):
    """Token2Wav that records each flow call as the official `token2wav` arguments and raw mel."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.calls: list[dict] = []
        self.mels: list[Tensor] = []
        self.current = None  # the stream being driven, for its token offset

    def mel(self, tokens: Tensor, prompt: FlowPrompt, streaming: bool = False, finalize: bool = True) -> Tensor:
        mel = super().mel(tokens, prompt, streaming=streaming, finalize=finalize)
        offset = self.current.offset if self.current is not None else 0
        self.calls.append({"token_len": tokens.shape[1], "token_offset": offset, "stream": streaming,
                           "finalize": finalize})
        self.mels.append(mel)
        return mel


@torch.inference_mode()
def token2wav_case(g: GoldenModels, case: dict) -> dict[str, Any]:
    """The official `CosyVoice3Model.tts` on given tokens (vc path): our Token2Wav, whole or streaming."""
    inp, args = case["inputs"], case["args"]
    t2w = _RecordingToken2Wav(g.flow, g.hift, hop_len=int(args["token_hop_len"]),
                              max_hop_len=int(args["token_max_hop_len"]), hop_growth=int(args["stream_scale_factor"]),
                              stream_vocoder=import_object(g.model.family.stream_vocoder))
    if t2w.lookahead != int(args["pre_lookahead_len"]):
        raise ValueError(f"pre_lookahead_len {args['pre_lookahead_len']} != the flow's {t2w.lookahead}")
    tokens = g.tensor(inp["source_speech_token"])
    prompt = FlowPrompt(g.tensor(inp["flow_prompt_speech_token"]), g.tensor(inp["prompt_speech_feat"]),
                        g.tensor(inp["flow_embedding"]))
    if args["stream"]:
        stream = t2w.current = t2w.stream(prompt)
        chunks = stream.push(tokens[0].tolist()) + [stream.finish()]
    else:
        chunks = [t2w(tokens, prompt)]
    return {"token2wav_calls": t2w.calls, "chunks": [c.unsqueeze(0) for c in chunks], "flow_mel_per_call": t2w.mels}


# (test on the case's `producer`, handler); tried before the CosyVoice2 handlers, first match wins.
HANDLERS = [
    (lambda p: p.startswith("CosyVoice3Model.tts("), token2wav_case),  # its producer names the flow too
    (lambda p: "CausalMaskedDiffWithDiT.inference" in p, flow_case),
    (lambda p: p.startswith("CausalHiFTGenerator.inference on the accumulated"), hift_stream_case),
    (lambda p: p.startswith("CausalHiFTGenerator.inference("), hift_inference_case),
    (lambda p: p.startswith("CausalHiFTGenerator.decode("), hift_decode_case),
    (lambda p: "CausalHiFTGenerator.__init__" in p and "SineGen2" in p, hift_noise_tables_case),
]
