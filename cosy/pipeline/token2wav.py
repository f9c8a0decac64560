"""Speech tokens -> 24 kHz audio: flow (tokens -> mel) then HiFT (mel -> wav), whole or streaming.

Streaming follows the official chunking: a chunk fires once `hop + lookahead` new tokens are there; the
first hop is padded so that prompt + first chunk end on a chunk boundary; hops grow 25 -> 50 -> 100; each
chunk re-runs the flow over prompt + all tokens so far (chunk masks, fixed noise, so the prefix is
unchanged) and keeps the new mel frames; how those become audio is the family's vocoder semantics
(`cosy.pipeline.stream_vocoder`: CosyVoice2 crossfades HiFT chunks, CosyVoice3 re-vocodes the whole mel).
Streams (`Token2WavStream`, cosy.pipeline.token2wav_stream) also compute the frames that complete the
prompt's last chunk ahead of the first chunk, while the LM makes the rest of its tokens.
Unlike the official code, every piece of state lives in the per-request `Token2WavStream`, so concurrent
requests share only read-only modules, and speed control also works while streaming.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from cosy.flow import incremental
from cosy.flow.dit_model import DiTFlowModel
from cosy.flow.model import FlowModel
from cosy.hift.causal_generator import CausalHiFTGenerator
from cosy.hift.generator import HiFTGenerator
from cosy.model.family import import_object
from cosy.model.files import ModelDir
from cosy.model.load import as_model_dir, load_flow, load_hift
from cosy.pipeline.jobs import ChunkInputs, ChunkJob, FlowJob, FlowPrompt
from cosy.pipeline.speed import MelStretcher
from cosy.pipeline.stream_vocoder import MEL_CACHE_FRAMES, CrossfadeVocoder, VocodeJob, crossfade, hamming_window
from cosy.pipeline.token2wav_stream import Token2WavStream
from cosy.preemption import preemption_point
from cosy.speech.cache import StateBudget

__all__ = ["MEL_CACHE_FRAMES", "ChunkJob", "FlowJob", "FlowPrompt", "MelStretcher", "Token2Wav", "Token2WavStream",
           "crossfade", "load_token2wav"]


class Token2Wav:
    """Flow + HiFT with the official streaming schedule. Stateless: per-request state is in streams.

    `stream_vocoder`: the class turning a stream's mel chunks into audio (the family's
    `ModelFamily.stream_vocoder`; CosyVoice2's crossfade by default).
    """

    def __init__(self, flow: FlowModel | DiTFlowModel, hift: HiFTGenerator | CausalHiFTGenerator, hop_len: int = 25,
                 max_hop_len: int = 100, hop_growth: int = 2, state_budget: StateBudget | None = None,
                 stream_vocoder: Callable[..., Any] = CrossfadeVocoder):
        self.flow = flow.eval()
        # streaming computes only new frames when a budget is given (else every chunk recomputes the prefix)
        self.state_budget = state_budget if state_budget is not None and incremental.supports(flow) else None
        self.hift = hift.eval()
        self.hop_len, self.max_hop_len, self.hop_growth = hop_len, max_hop_len, hop_growth
        self.lookahead = flow.cfg.pre_lookahead_len
        self.samples_per_frame = math.prod(hift.cfg.upsample_rates) * hift.cfg.istft_hop_len  # 480
        self.source_cache_len = MEL_CACHE_FRAMES * self.samples_per_frame  # 3840
        self.window = hamming_window(hift, self.device)  # CosyVoice2's crossfade window
        self.stream_vocoder = stream_vocoder

    @property
    def sample_rate(self) -> int:
        return self.hift.cfg.sampling_rate

    @property
    def device(self) -> torch.device:
        return next(self.hift.parameters()).device

    def first_pad(self, prompt_tokens: int) -> int:
        """Tokens that complete the prompt's last hop: the first chunk is that much longer (official)."""
        return math.ceil(prompt_tokens / self.hop_len) * self.hop_len - prompt_tokens

    def first_chunk_tokens(self, prompt_tokens: int) -> int:
        """Tokens a stream's first chunk waits for, after a prompt of `prompt_tokens`: the pad, one hop and
        the look-ahead."""
        return self.first_pad(prompt_tokens) + self.hop_len + self.lookahead

    def generator(self, seed: int | None) -> torch.Generator:
        g = torch.Generator(device=self.device)
        g.manual_seed(seed if seed is not None else torch.seed())
        return g

    def mel(self, tokens: Tensor, prompt: FlowPrompt, streaming: bool = False, finalize: bool = True) -> Tensor:
        """tokens (1, T) -> mel (1, 80, 2*T) (2*(T-3) when not finalizing: the lookahead is only context)."""
        dev = self.device
        return self.flow.inference(tokens.to(dev), prompt.tokens.to(dev), prompt.mel.to(dev),
                                   prompt.embedding.to(dev), streaming=streaming, finalize=finalize)

    @torch.inference_mode()
    def vocode(self, mel: Tensor, seed: int | None = None) -> Tensor:
        """mel (1, 80, F) -> wav (F*480,) float32 in [-0.99, 0.99]; `seed` fixes HiFT's source phases."""
        speech, _ = self.hift.inference(mel.to(self.device, torch.float32), generator=self.generator(seed))
        return speech[0].cpu()

    @torch.inference_mode()
    def __call__(self, tokens: Tensor, prompt: FlowPrompt, speed: float = 1.0, seed: int | None = None) -> Tensor:
        """Whole-utterance synthesis: tokens (1, T) -> wav (int(2T / speed) * 480,) float32."""
        mel = self.mel(tokens, prompt)
        if speed != 1.0:  # the official speed control: linear resampling of the mel in time
            mel = F.interpolate(mel, size=int(mel.shape[2] / speed), mode="linear")
        preemption_point()
        return self.vocode(mel, seed)

    def whole_job(self, tokens: Tensor, prompt: FlowPrompt, speed: float = 1.0, seed: int | None = None) -> FlowJob:
        """`self(tokens, prompt, speed, seed)` as a batchable job (see `run_jobs`)."""
        def finish(mel: Tensor) -> Tensor:
            if speed != 1.0:
                mel = F.interpolate(mel, size=int(mel.shape[2] / speed), mode="linear")
            return self.vocode(mel, seed)
        return FlowJob(tokens, prompt, finish)

    @torch.inference_mode()
    def run_jobs(self, jobs: list[FlowJob]) -> list[Any]:
        """Run the flows of `jobs` as one padded batch, then each job's own HiFT step (its state is per row).

        If the flow batch raises, nothing has changed (rerun the jobs alone); a failing HiFT step fails its
        own row only: its result is the exception."""
        dev = self.device
        mels = self.flow.inference_batch([(j.tokens.to(dev), j.prompt.tokens.to(dev), j.prompt.mel.to(dev),
                                           j.prompt.embedding.to(dev)) for j in jobs])
        out: list[Any] = []
        for j, m in zip(jobs, mels):
            preemption_point()  # (what a point raises ends the batch, which is then rerun alone)
            try:
                out.append(j.finish(m))
            except Exception as e:
                out.append(e)
        return out

    @torch.inference_mode()
    def run_chunks(self, jobs: list[ChunkJob]) -> list[Any]:
        """Streaming chunks of several streams (`Token2WavStream.chunk_job`): each runs its encoder, then rows
        at the same place (equal state frames and stop: e.g. requests of one saved voice at the same chunk)
        run their incremental flow as one batch (`incremental.sample_new_rows`), the others alone. A batch
        holds no more rows than the state budget's free room takes new states for, and each batch finishes
        (its states kept within the budget, in storage of their own) before the next runs. A failing batch
        is rerun row by row; a failing row fails alone (its result is the exception)."""
        results: list[Any] = []
        for job in jobs:
            try:
                results.append(job.prepare())
            except Exception as e:
                results.append(e)
        inputs = list(results)
        groups: dict[tuple[int, int], list[int]] = {}
        for i, inp in enumerate(inputs):
            if isinstance(inp, ChunkInputs):  # rows without a state (a first chunk, no saved voice) run alone
                groups.setdefault((inp.past, inp.mu.size(2)) if inp.state is not None else (-1, i), []).append(i)

        def flows(part: list[int]) -> list[tuple[int, Any]]:
            try:
                return list(zip(part, incremental.sample_new_rows(
                    self.flow, [(inputs[i].mu, inputs[i].spks, inputs[i].cond, inputs[i].state) for i in part])))
            except Exception as e:
                return [(part[0], e)] if len(part) == 1 else [r for i in part for r in flows([i])]

        for key, rows in groups.items():
            size = 1  # the new states of one batch (rows x frames x bytes per frame) fit the budget's free room
            if key[0] > 0:
                state = inputs[rows[0]].state
                size = max(1, self.state_budget.room() // max(1, state.nbytes * key[1] // state.frames))
            for part in (rows[k:k + size] for k in range(0, len(rows), size)):
                for i, out in flows(part):
                    if isinstance(out, Exception):
                        results[i] = out
                        continue
                    try:
                        results[i] = jobs[i].finish(inputs[i], *out)
                    except Exception as e:
                        results[i] = e
        return results

    @torch.inference_mode()
    def run_vocode(self, jobs: list[VocodeJob]) -> list[Any]:
        """HiFT steps of several streams (`Token2WavStream.vocode_job`): rows of equal shape run as one batch
        (`HiFTGenerator.inference_rows`), each finishing with its own stream state. A failing finish fails
        its own row only (its result is the exception); if the HiFT batch raises, nothing has changed."""
        groups: dict[tuple[int, int], list[int]] = {}
        for i, job in enumerate(jobs):
            groups.setdefault(job.shape, []).append(i)
        outs: list[tuple[Tensor, Tensor] | None] = [None] * len(jobs)
        for rows in groups.values():
            mel = torch.cat([jobs[i].mel for i in rows]).to(self.device, torch.float32)
            speech, source = self.hift.inference_rows(mel, [jobs[i].cache_source for i in rows],
                                                      [jobs[i].generator for i in rows])
            for k, i in enumerate(rows):
                outs[i] = (speech[k:k + 1], source[k:k + 1])
        results: list[Any] = []
        for job, (speech, source) in zip(jobs, outs):
            try:
                results.append(job.finish(speech, source))
            except Exception as e:
                results.append(e)
        return results

    def stream(self, prompt: FlowPrompt, speed: float = 1.0, seed: int | None = None) -> "Token2WavStream":
        """A streaming session: push tokens as the LM makes them, get audio chunks back."""
        return Token2WavStream(self, prompt, speed, self.generator(seed))


def load_token2wav(model_dir: str | Path | ModelDir, device: str | torch.device = "cpu",
                   dtype: torch.dtype = torch.float32, cache_mb: int = 0) -> Token2Wav:
    """Flow + HiFT of a model directory, ready for `Token2Wav.__call__` or `.stream()`.

    `dtype` applies to the flow; HiFT stays float32 (its phase accumulation needs it). `cache_mb` > 0:
    streaming keeps up to that many MiB of flow state (finished chunks, saved voices' prompts) to compute
    only new frames; 0: every chunk recomputes its prefix, as the official code does.
    """
    md = as_model_dir(model_dir)
    budget = StateBudget(cache_mb << 20) if cache_mb > 0 else None
    return Token2Wav(load_flow(md, device, dtype), load_hift(md, device),
                     hop_len=md.config.chunk_size, max_hop_len=4 * md.config.chunk_size, state_budget=budget,
                     stream_vocoder=import_object(md.family.stream_vocoder))
