"""Speech tokens -> 24 kHz audio: flow (tokens -> mel) then HiFT (mel -> wav), whole or streaming.

Streaming follows the official chunking: a chunk fires once `hop + lookahead` new tokens are there; the
first hop is padded so that prompt + first chunk end on a chunk boundary; hops grow 25 -> 50 -> 100; each
chunk re-runs the flow over prompt + all tokens so far (chunk masks, fixed noise, so the prefix is
unchanged) and keeps the new mel frames; how those become audio is the family's vocoder semantics
(`cosy.pipeline.stream_vocoder`: CosyVoice2 crossfades HiFT chunks, CosyVoice3 re-vocodes the whole mel).
With a state budget (the incremental flow) the frames that complete the prompt's last chunk are computed as
soon as their tokens are there (`compute_ahead`), while the LM makes the rest of the first chunk's tokens.
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


class Token2WavStream:
    """Per-request streaming state: tokens so far, chunk offset, HiFT cache, speed stretcher."""

    def __init__(self, t2w: Token2Wav, prompt: FlowPrompt, speed: float, generator: torch.Generator):
        self.t2w, self.generator = t2w, generator
        # on the device once per stream, not once per chunk (the flow's .to() calls are then no-ops)
        # on the device once per stream; the cache key (saved voices' prompt state) is kept
        self.prompt = FlowPrompt(*(x.to(t2w.device) for x in (prompt.tokens, prompt.mel, prompt.embedding)),
                                 cache_key=prompt.cache_key)
        self.window = t2w.window.to(t2w.device)
        self.tokens: list[int] = []
        self.offset = 0  # tokens already turned into audio
        self.hop = t2w.hop_len
        n_prompt = prompt.tokens.shape[1]
        self.first_pad = math.ceil(n_prompt / t2w.hop_len) * t2w.hop_len - n_prompt
        self.stretcher = MelStretcher(speed) if speed != 1.0 else None
        self.vocoder = t2w.stream_vocoder(t2w.hift, generator, self.window)  # mel chunks -> audio chunks
        self.state: incremental.FlowState | None = None  # flow state of finished chunks (with a budget)
        self.held: Tensor | None = None  # mel frames computed ahead of the first chunk (`compute_ahead`)
        self.ahead_done = False
        self.finished = False

    @property
    def first_chunk_tokens(self) -> int:
        """Tokens the first chunk waits for: the prompt's pad, one hop and the look-ahead."""
        return self.first_pad + self.t2w.hop_len + self.t2w.lookahead

    def _next_hop(self) -> int:
        return self.hop + self.first_pad if self.offset == 0 else self.hop

    def add(self, tokens: list[int] | Tensor) -> None:
        """Add new speech tokens without computing anything (`push([])` computes what is `due`)."""
        if self.finished:
            raise RuntimeError("this stream is finished")
        self.tokens.extend(int(t) for t in (tokens.flatten().tolist() if isinstance(tokens, Tensor) else tokens))

    def due(self) -> bool:
        """Whether a chunk is ready to compute."""
        return len(self.tokens) - self.offset >= self._next_hop() + self.t2w.lookahead

    def ahead_due(self) -> bool:
        """Whether the frames that complete the prompt's last chunk (its `first_pad` tokens) can be computed
        ahead of the first chunk (`compute_ahead`): their tokens and look-ahead are there, the first chunk's
        are not yet. Computed then, while the LM makes the rest of the first chunk's tokens, they leave the
        first chunk one chunk of flow instead of two (with a state budget only: the incremental flow). Worth
        it only for a stream sure to reach its first chunk (`first_chunk_tokens`): a shorter one ends with the
        final pass, which recomputes everything.
        They end on a chunk boundary (the pad exists for that), so chunk masks keep their values from
        depending on later tokens: they are exactly what the first chunk would compute."""
        flow = self.t2w.flow
        chunk_frames = flow.stream_chunk_tokens * flow.cfg.token_mel_ratio
        return (not self.ahead_done and self.offset == 0 and self.t2w.state_budget is not None
                and len(self.tokens) >= self.first_pad + self.t2w.lookahead and not self.due()
                and self._ahead_stop() % chunk_frames == 0)

    def _ahead_stop(self) -> int:
        return (self.prompt.tokens.shape[1] + self.first_pad) * self.t2w.flow.cfg.token_mel_ratio

    @torch.inference_mode()
    def compute_ahead(self, job: ChunkJob | None = None) -> None:
        """Flow up to the end of the prompt's last chunk (`ahead_due` must hold), from the saved voice's
        prompt state when there is one; its emitted frames are held until the first chunk, which continues
        from its state. `job`: the `ahead_job()` already made, run here alone."""
        job = job or self.ahead_job()
        inputs = job.prepare()
        job.finish(inputs, *incremental.sample_new(self.t2w.flow, inputs.mu, inputs.spks, inputs.cond,
                                                   inputs.state))

    def ahead_job(self) -> ChunkJob:
        """`compute_ahead()` as a batchable job (`Token2Wav.run_chunks`: the same voice's streams batch);
        its result is None. Run exactly one of the two, once."""
        self.ahead_done = True
        # without the look-ahead's frames (not final) the encoder's output ends at the chunk boundary
        tokens = torch.tensor(self.tokens[:self.first_pad + self.t2w.lookahead], dtype=torch.int32).unsqueeze(0)

        def finish(inputs: ChunkInputs, mel: Tensor, state: incremental.FlowState) -> None:
            if self.t2w.state_budget.charge(id(self), state.nbytes):
                self.state, self.held = state.compact(), mel[:, :, inputs.start - inputs.past:]
        return ChunkJob(lambda: self._chunk_inputs(tokens), finish, self._ahead_stop() - self.prompt.mel.shape[1])

    @torch.inference_mode()
    def push(self, tokens: list[int] | Tensor) -> list[Tensor]:
        """Add new speech tokens; returns the audio chunks (each (N,) float32) that became ready."""
        return [self.vocode(mel) for mel in self.push_mels(tokens)]

    @torch.inference_mode()
    def push_mels(self, tokens: list[int] | Tensor) -> list[Tensor]:
        """`push` up to the vocoder: the new mel frames (1, 80, n) of each chunk that became ready (speed
        applied). Hand each, in order, to `vocode` (or run its `vocode_job`) before the next push."""
        self.add(tokens)
        mels = []
        while self.due():
            mels.append(self.next_mel())
        return mels

    @torch.inference_mode()
    def next_mel(self) -> Tensor:
        """The next due chunk's new mel frames (1, 80, n), speed applied (`due()` must hold)."""
        mel = self._chunk_mel(self._due_tokens(), finalize=False)
        self._advance()
        return mel

    def chunk_job(self) -> ChunkJob | None:
        """`next_mel()` as a batchable job (`Token2Wav.run_chunks`); None without a state budget (chunks then
        recompute their prefix, as the official code does). Run exactly one of the two, once."""
        if self.t2w.state_budget is None:
            return None
        tokens = torch.tensor(self._due_tokens(), dtype=torch.int32).unsqueeze(0)

        def finish(inputs: ChunkInputs, mel: Tensor, state: incremental.FlowState) -> Tensor:
            out = self._stretch(self._chunk_output(inputs, mel, state), finalize=False)
            self._advance()
            return out
        frames = self._next_hop() * self.t2w.flow.cfg.token_mel_ratio
        return ChunkJob(lambda: self._chunk_inputs(tokens), finish, frames)

    def _due_tokens(self) -> list[int]:
        return self.tokens[:self.offset + self._next_hop() + self.t2w.lookahead]

    def _advance(self) -> None:
        self.offset += self._next_hop()
        self.hop = min(self.t2w.max_hop_len, self.hop * self.t2w.hop_growth)

    @torch.inference_mode()
    def vocode(self, mel: Tensor) -> Tensor:
        """A non-final chunk's mel (from `push_mels`) -> its audio chunk (N,) float32."""
        return self.vocoder.push(mel, False)

    def vocode_job(self, mel: Tensor) -> VocodeJob | None:
        """`vocode(mel)` as a batchable HiFT step (`Token2Wav.run_vocode`); None when the family's vocoder
        cannot batch (or there is nothing to vocode). Run exactly one of the two."""
        return self.vocoder.job(mel, False)

    @torch.inference_mode()
    def finish(self) -> Tensor:
        """Flush: the last chunk, computed with full attention over all tokens."""
        if self.finished:
            raise RuntimeError("this stream is finished")
        self.finished = True
        return self._chunk(self.tokens, finalize=True)

    def finish_job(self) -> FlowJob | None:
        """`finish()` as a batchable job (see `Token2Wav.run_jobs`); None when it computes no flow."""
        if self.finished:
            raise RuntimeError("this stream is finished")
        if not self.tokens and self.vocoder.empty:
            return None
        token_tensor = torch.tensor(self.tokens, dtype=torch.int32).unsqueeze(0)

        def finish(mel: Tensor) -> Tensor:
            if self.finished:
                raise RuntimeError("this stream is finished")
            self.finished = True
            self.close()
            return self._vocode(mel[:, :, self.offset * self.t2w.flow.cfg.token_mel_ratio:], finalize=True)
        return FlowJob(token_tensor, self.prompt, finish)

    def close(self) -> None:
        """Drop the flow state (done by `finish`; call it for a stream given up early)."""
        self.state = self.held = None
        if self.t2w.state_budget is not None:
            self.t2w.state_budget.release(id(self))

    def __del__(self):
        if getattr(self, "t2w", None) is not None and self.t2w.state_budget is not None:
            self.t2w.state_budget.release(id(self))

    def _new_frames(self, tokens: Tensor) -> Tensor:
        """A non-final chunk's mel computed on its new frames only, from the state of earlier ones."""
        inputs = self._chunk_inputs(tokens)
        mel, state = incremental.sample_new(self.t2w.flow, inputs.mu, inputs.spks, inputs.cond, inputs.state)
        return self._chunk_output(inputs, mel, state)

    def _chunk_inputs(self, tokens: Tensor) -> ChunkInputs:
        """The encoder's conditions of a non-final chunk and the state it continues (this stream's, or a
        saved voice's prompt state, computed and stored on first use)."""
        t2w, p, dev = self.t2w, self.prompt, self.t2w.device
        flow, budget = t2w.flow, t2w.state_budget
        mu, spks, cond = flow.conditions(tokens.to(dev), p.tokens.to(dev), p.mel.to(dev), p.embedding.to(dev),
                                         streaming=True, finalize=False)
        start = p.mel.shape[1] + self.offset * flow.cfg.token_mel_ratio  # first frame to return
        state = self.state
        if state is None and p.cache_key is not None:
            state = budget.voice(p.cache_key)
            if state is None:
                n = incremental.prompt_frames(flow, p.tokens.shape[1])
                if 0 < n <= start:
                    _, state = incremental.sample_new(flow, mu, spks, cond, None, stop=n)
                    budget.put_voice(p.cache_key, state)
        if state is not None and state.frames > start and self.held is None:
            state = None
        return ChunkInputs(mu, spks, cond, state, start)

    def _chunk_output(self, inputs: ChunkInputs, mel: Tensor, state: incremental.FlowState) -> Tensor:
        """Keep the new state (within the budget) and return the frames this chunk emits (after those
        computed ahead of it, if any)."""
        self.state = state.compact() if self.t2w.state_budget.charge(id(self), state.nbytes) else None
        out = mel[:, :, max(0, inputs.start - inputs.past):]
        if self.held is not None:
            out, self.held = torch.cat([self.held, out], dim=2), None
        return out

    def _chunk(self, tokens: list[int], finalize: bool) -> Tensor:
        if not tokens and self.vocoder.empty:
            return torch.zeros(0)
        return self.vocoder.push(self._chunk_mel(tokens, finalize), finalize)

    def _chunk_mel(self, tokens: list[int], finalize: bool) -> Tensor:
        """A chunk's new mel frames (1, 80, n), through this stream's speed stretcher."""
        t2w = self.t2w
        token_tensor = torch.tensor(tokens, dtype=torch.int32).unsqueeze(0)
        if finalize:
            self.close()
        if not finalize and t2w.state_budget is not None:
            mel = self._new_frames(token_tensor)
        else:  # the official last chunk runs without chunk masks (full attention); earlier ones stream
            mel = t2w.mel(token_tensor, self.prompt, streaming=not finalize, finalize=finalize)
            mel = mel[:, :, self.offset * t2w.flow.cfg.token_mel_ratio:]
        return self._stretch(mel, finalize)

    def _stretch(self, mel: Tensor, finalize: bool) -> Tensor:
        return mel if self.stretcher is None else self.stretcher.push(mel, final=finalize)

    def _vocode(self, mel: Tensor, finalize: bool) -> Tensor:
        """A chunk's new mel frames -> its audio (this stream's speed stretcher, then its vocoder state)."""
        return self.vocoder.push(self._stretch(mel, finalize), finalize)


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
