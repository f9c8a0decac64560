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

from cosy.hift.noise_tables import NoiseTables, state_before_source, uv_table
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


def _tables_match(state: Tensor, prefix: str, g: GoldenModels, uv: bool) -> dict[str, tuple]:
    cfg = g.hift.cfg
    tables = NoiseTables(state, cfg.nb_harmonics + 1, cfg.max_seconds * cfg.sampling_rate)
    n = g.tensors[f"{prefix}sine_waves_prefix"].shape[1]
    out = {f"[{prefix}rand_ini]": (torch.equal(tables.rand_ini, g.tensors[f"{prefix}rand_ini"]), True),
           f"[{prefix}sine_waves_prefix]": (torch.equal(tables.sine_waves(n), g.tensors[f"{prefix}sine_waves_prefix"]),
                                            True)}
    if uv:
        out[f"[{prefix}uv_prefix]"] = (torch.equal(uv_table(state, cfg.nb_harmonics + 1,
                                                            cfg.max_seconds * cfg.sampling_rate, n),
                                                   g.tensors[f"{prefix}uv_prefix"]), True)
    return out


def _checksums(table: Tensor, ref: dict) -> dict[str, tuple]:
    """Float64 checksums of a whole table against the official ones (relative 1e-9: summation order)."""
    x = table.double()
    ours = {"sum": x.sum().item(), "sum_abs": x.abs().sum().item(), "sum_sq": (x * x).sum().item(),
            "min": x.min().item(), "max": x.max().item()}
    return {k: (abs(ours[k] - ref[k]) <= 1e-9 * max(1.0, abs(ref[k])), True) for k in ours if k in ref}


@torch.inference_mode()
def hift_noise_tables_case(g: GoldenModels, case: dict) -> dict[str, Any]:
    """The tables of the loaded vocoder (its generator state replayed from the yaml) equal the official ones;
    the replayed states equal the recorded ones, for this model and for the published full size."""
    source = g.hift.m_source
    cfg = g.hift.cfg
    n = g.tensors["hift.noise.sine_waves_prefix"].shape[1]
    out: dict[str, Any] = {"rand_ini": source.tables.rand_ini, "sine_waves_prefix": source.tables.sine_waves(n)}
    state = state_before_source(cfg)
    out["uv_prefix"] = uv_table(state, cfg.nb_harmonics + 1, cfg.max_seconds * cfg.sampling_rate, n)
    out["[state replayed = recorded]"] = (torch.equal(state, g.tensors["hift.noise.rng_state_before_sinegen2"]), True)
    whole = source.tables.sine_waves(cfg.max_seconds * cfg.sampling_rate)
    sums = g.extra["hift_noise_tables"]["sine_waves"]["checksum_whole"]
    out.update({f"[sine_waves.checksum_whole.{k}]": v for k, v in _checksums(whole, sums).items()})
    # the published size: only the f0 predictor's width differs among what the replay depends on
    full = replace(cfg, f0_cond_channels=512)
    full_state = state_before_source(full)
    out["[full_size state replayed = recorded]"] = (
        torch.equal(full_state, g.tensors["full_size.hift_rng_state_before_sinegen2"]), True)
    out.update(_tables_match(full_state, "full_size.hift_noise_", g, uv=False))
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
