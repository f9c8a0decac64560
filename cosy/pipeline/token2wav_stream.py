"""One request's streaming state (`Token2Wav.stream`): tokens so far, the chunk schedule, the incremental
flow's state, the frames computed ahead of the first chunk, the speed stretcher and the vocoder state.

The chunk schedule is the official one (see `cosy.pipeline.token2wav`). With a state budget (the incremental
flow) the frames that complete the prompt's last chunk are computed as soon as their tokens are there
(`compute_ahead`), while the LM makes the rest of the first chunk's tokens.
"""
from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from cosy.flow import incremental
from cosy.pipeline.jobs import ChunkInputs, ChunkJob, FlowJob, FlowPrompt
from cosy.pipeline.speed import MelStretcher
from cosy.pipeline.stream_vocoder import VocodeJob


def stream_room(t2w: Any, prompt_tokens: int, speed: float = 1.0) -> int:
    """The most speech tokens one stream of `t2w` (a `Token2Wav`) can take after a prompt of `prompt_tokens`:
    every flow call runs over the prompt's and the stream's frames from frame 0 of the CFM's fixed noise, and a
    vocoder with fixed noise tables (CosyVoice3's causal HiFT) reads them at each sample's place in the stream,
    the mel stretched by 1 / `speed`. A longer utterance needs more than one stream (`Engine.synthesize_duplex`)."""
    ratio = t2w.flow.cfg.token_mel_ratio
    room = t2w.flow.decoder.rand_noise.size(2) // ratio - prompt_tokens
    tables = getattr(getattr(t2w.hift, "m_source", None), "tables", None)
    if tables is not None:
        room = min(room, int(tables.max_samples // t2w.samples_per_frame * speed) // ratio)
    return room


class Token2WavStream:
    """Per-request streaming state: tokens so far, chunk offset, HiFT cache, speed stretcher."""

    # t2w: the `Token2Wav` that made it (not imported here: that module imports this one)
    def __init__(self, t2w: Any, prompt: FlowPrompt, speed: float, generator: torch.Generator):
        self.t2w, self.generator = t2w, generator
        # on the device once per stream, not once per chunk (the flow's .to() calls are then no-ops); the
        # cache key (saved voices' prompt state) is kept
        self.prompt = FlowPrompt(*(x.to(t2w.device) for x in (prompt.tokens, prompt.mel, prompt.embedding)),
                                 cache_key=prompt.cache_key)
        self.window = t2w.window.to(t2w.device)
        self.tokens: list[int] = []
        self.offset = 0  # tokens already turned into audio
        self.hop = t2w.hop_len
        self.first_pad = t2w.first_pad(prompt.tokens.shape[1])
        self.stretcher = MelStretcher(speed) if speed != 1.0 else None
        self.vocoder = t2w.stream_vocoder(t2w.hift, generator, self.window)  # mel chunks -> audio chunks
        self.state: incremental.FlowState | None = None  # flow state of finished chunks (with a budget)
        self.held: Tensor | None = None  # mel frames computed ahead of the first chunk (`compute_ahead`)
        self.ahead_done = False
        self.finished = False

    @property
    def first_chunk_tokens(self) -> int:
        """Tokens the first chunk waits for: the prompt's pad, one hop and the look-ahead."""
        return self.t2w.first_chunk_tokens(self.prompt.tokens.shape[1])

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
