"""The whole pipeline in one process: text (+ voice prompt) -> speech tokens -> mel -> 24 kHz audio.

    engine = Engine.from_model_dir("CosyVoice2-0.5B")
    for chunk in engine.synthesize(SynthesisRequest(mode="zero_shot", text=..., prompt_text=...,
                                                    prompt_wav="me.wav", stream=True)):
        play(chunk)   # (N,) float32 at engine.sample_rate

Long text is normalized and split into sentences; each is synthesized in order with the same voice, and
audio is yielded as soon as it is ready. A sentence longer than the LM's context takes is cut to fit before
anything is spoken (`cosy.pipeline.lm_input.fit_context`). The LM is anything with `SpeechLM.generate`'s
signature: the embedded `SpeechLM` by default, or a pool of remote vLLM backends (`cosy.lm.pool`).
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import logging
import random
from pathlib import Path
from typing import Callable, Iterable, Iterator, Protocol

import torch
from torch import Tensor

from cosy.audio.io import load_prompt_wav
from cosy.lm import first_chunk
from cosy.lm.bistream import decode as bistream_decode
from cosy.lm.bistream_steps import EmbeddedSteps, RemoteSteps
from cosy.lm.export import llm_fingerprint, served_model_name
from cosy.lm.prompt import PromptEmbedder
from cosy.lm.sampling import SamplingParams
from cosy.lm.silence import drop_long_silence
from cosy.model.families.cosyvoice2 import FAMILY as COSYVOICE2
from cosy.model.family import ModelFamily, import_object
from cosy.model.files import ModelDir
from cosy.model.precision import resolve_dtype, set_tf32
from cosy.pipeline.duplex import text_segments, token_streams
from cosy.pipeline.duplex_marks import CallerText, DuplexMarks
from cosy.pipeline.lm_input import LMInput, fit_context, lm_input, lm_prompt
from cosy.pipeline.request import (
    EMBEDDED_LM_MAX_LEN,
    LM_DUPLEX_SEGMENT_TOKENS,
    SynthesisError,
    SynthesisRequest,
)
from cosy.pipeline.timing import SentenceClock, SentenceMark
from cosy.pipeline.token2wav import FlowPrompt, Token2Wav, load_token2wav
from cosy.pipeline.token2wav_stream import stream_room
from cosy.prompt.encoder import PromptFeatures, VoicePromptEncoder
from cosy.speech.scheduler import Batch
from cosy.text.control import plain_text_origin, streamed_text
from cosy.text.frontend import TextFrontend
from cosy.text.language import check_family_language
from cosy.text.lexicon import document_origin
from cosy.text.offsets import segment_spans, strip_prefix
from cosy.text.origin import Origin, caller_spans
from cosy.text.ssml import Break
from cosy.text.ssml_text import spoken_runs
from cosy.text.tokenizer import TextTokenizer

log = logging.getLogger(__name__)


class SpeechTokenLM(Protocol):
    sampling: SamplingParams

    def generate(self, prompt_embeds: Tensor, min_len: int, max_len: int, seed: int | None = None,
                 params: SamplingParams | None = None) -> Iterator[int]: ...


class Engine:
    """Text frontend, voice prompt encoder, LM and token2wav, shared by concurrent requests."""

    def __init__(self, text: TextFrontend, prompts: VoicePromptEncoder, lm: SpeechTokenLM, t2w: Token2Wav,
                 prompt_embeds, family: ModelFamily = COSYVOICE2, lm_context: Callable[[], int | None] | None = None):
        """`lm_context`: the most tokens one LM call may hold (the backends' max_model_len), asked per request;
        None: unknown, the text's segments go as the official frontend makes them."""
        self.text, self.prompts, self.lm, self.t2w = text, prompts, lm, t2w
        self.lm_context = lm_context or (lambda: None)
        self._prompt_embeds = prompt_embeds  # (text ids, prompt text ids, prompt speech tokens) -> (1, L, H)
        self.family = family  # prompt format and length limits
        # runs flow/HiFT work: (first_chunk, fn) -> fn(); a worker serving many requests at once sets
        # a `cosy.speech.scheduler.SpeechScheduler.run` here
        self.speech_runner = None
        # the LM decodes a stream's first chunk apart when told how many tokens it is (a BackendPool with
        # `embed_speech`: `cosy.lm.first_chunk`); the embedded LM pauses by itself between tokens
        self.split_first = getattr(lm, "embed_speech", None) is not None

    @classmethod
    def from_model_dir(cls, model_dir: str | Path, device: str = "cpu", dtype: torch.dtype | str = torch.float32,
                       ttsfrd_dir: str | Path | None = None, llm_base_url: str | None = None,
                       llm_api_key: str | None = None, cache_mb: int = 0, tf32: bool = True,
                       llm_variant: str | None = None, compile: bool = False, flow_batch: int = 1,
                       require_backend: bool = True, llm_split_first_chunk: str = "auto") -> "Engine":
        """Everything from one model directory. With `llm_base_url` (comma-separated backends) the LM runs
        remotely and only its embedding tables are loaded here; the backends are checked now (key accepted,
        serving this llm.pt; reachable: at least one, unless `require_backend` is False, as for a server's
        workers, which start before their backend does and are not ready until it serves). `cache_mb`:
        streaming flow state budget (`load_token2wav`).
        `llm_variant`: another LM checkpoint of the family (CosyVoice3 "rl": llm.rl.pt), embedded or served.

        `dtype` (or its name, `--dtype`; `auto` picks for each of the two): the embedded LM's and the flow
        estimator's; the rest stays float32
        (`cosy.model.precision`, which also says where it is allowed: ValueError otherwise). `tf32`: on a
        CUDA device, TF32 matmuls and convolutions for this process (False: strict float32). `compile`:
        torch.compile the flow estimator and the embedded LM's stack, compiled here before any request
        (`cosy.pipeline.compiled`); `flow_batch` > 1 (the worker batches flows) compiles the batched graphs
        too. `llm_split_first_chunk` (auto, on, off): a streamed utterance's first chunk decoded apart on the
        backends (`cosy.lm.first_chunk`; auto: when they are on this machine)."""
        if isinstance(dtype, str):  # `auto` picks per role
            dtype, flow_dtype = resolve_dtype(dtype, device, "lm"), resolve_dtype(dtype, device, "flow")
        else:
            resolve_dtype(str(dtype).removeprefix("torch."), device)
            flow_dtype = dtype
        set_tf32(device, tf32)
        md = ModelDir(model_dir)
        family = md.family
        text = TextFrontend(TextTokenizer.from_dir(md.file(family.files.qwen_dir),
                                                   import_object(family.text_specials)), ttsfrd_dir)
        if llm_base_url:
            from cosy.lm.pool import connect  # the backend client (openai, httpx): only when there are backends
            from cosy.lm.remote import smallest_context
            lm: SpeechTokenLM = connect(llm_base_url, llm_api_key,
                                        served_model_name(llm_fingerprint(md.path, variant=llm_variant), family),
                                        md.config.sampling, family=family, require_reachable=require_backend)
            context = functools.partial(smallest_context, lm.backends)
            prompt_embeds = PromptEmbedder.from_model_dir(md, llm_variant)
            if first_chunk.wanted(llm_split_first_chunk, llm_base_url):
                lm.embed_speech = prompt_embeds.speech
        else:
            lm = import_object(family.lm).from_model_dir(md, device=device, dtype=dtype, variant=llm_variant)
            prompt_embeds = lm.prompt_embeds
            context = _embedded_context
        gpu = torch.device(device).index or 0  # the speech tokenizer's GPU, if onnxruntime has CUDA
        t2w = load_token2wav(md, device, flow_dtype, cache_mb)
        if compile:
            from cosy.pipeline import compiled
            compiled.compile_flow(t2w.flow)
            embedded = None if llm_base_url else lm
            if embedded is not None:
                compiled.compile_lm(embedded)
            compiled.warm_up(t2w, embedded, rows=flow_batch)
        return cls(text, VoicePromptEncoder(md, gpu=gpu), lm, t2w, prompt_embeds, family, context)

    @property
    def sample_rate(self) -> int:
        return self.t2w.sample_rate

    def prompt_features(self, source: object) -> PromptFeatures:
        return self.prompts.encode(source)

    def synthesize(self, req: SynthesisRequest,
                   on_mark: Callable[[SentenceMark], None] | None = None) -> Iterator[Tensor]:
        """Yield (N,) float32 audio chunks in order: one per sentence, or streaming chunks. `on_mark` (called
        inside this iterator) gets each sentence's "begin" mark before its first chunk is yielded and its
        "end" mark after its last one is (`cosy.pipeline.timing`): each text segment the LM speaks is a
        sentence, its samples counted exactly, its span of the caller's text (`req.text`; SSML: the
        document's text content) found by `cosy.text.offsets`. The marks change nothing spoken."""
        caller = req.text
        req, origins = self._text_controls(req)
        clock = SentenceClock(caller, self.sample_rate, on_mark)
        clock.origins = origins
        chunks = self._synthesize(req, clock)
        try:
            for chunk in chunks:
                clock.count(chunk.numel())
                yield chunk
        finally:  # closed early: the LM stops now (`_token2wav`)
            chunks.close()

    def _synthesize(self, req: SynthesisRequest, clock: SentenceClock) -> Iterator[Tensor]:
        req.check()
        seed = req.seed if req.seed is not None else random.randrange(2**31)
        features = self._features(req)
        # a saved voice recurs: streaming keeps its prompt's flow state (keyed by content)
        key = _voice_key(features) if req.voice is not None else None
        flow_prompt = FlowPrompt(features.speech_tokens, features.mel, features.embedding, key)
        if req.mode == "vc":
            tokens = self.prompts.speech_tokens(_load16k(req.source_wav))
            yield from self._token2wav(iter(tokens.flatten().tolist()), flow_prompt, req, seed, tokens.numel())
            return
        speech = features.speech_tokens.flatten().tolist()
        if req.ssml or req.fixes:  # pronunciation fixes: the plain text as the document that marks them up
            yield from self._ssml(req, speech, flow_prompt, seed, clock)
            return
        inputs = self._fit(lm_input(self.text, self.family, req.mode, req.text, req.prompt_text, req.instruct_text,
                                    speech))
        spans = self._spans(req, req.text, inputs, clock)
        if clock.wanted:  # into the caller's text, through the text controls' rewrites
            spans = caller_spans(spans, clock.origins, clock.text)
        yield from self._speak(inputs, flow_prompt, req, seed, clock=clock, spans=spans)

    def _text_controls(self, req: SynthesisRequest) -> tuple[SynthesisRequest, list[Origin]]:
        """`req` with its plain text filtered (markdown) and its numbers read in its hint's language
        (`cosy.text.control`), and the maps from that text back to the caller's (`cosy.text.origin`); the
        family must speak that language."""
        req.check()
        check_family_language(req.language, self.family.name, self.family.display_name)
        if req.ssml or req.mode == "vc" or req.duplex or not (req.markdown or req.language):
            return req, []
        text, origins = plain_text_origin(req.text, req.language, req.markdown)
        return dataclasses.replace(req, text=text), origins

    def _spans(self, req: SynthesisRequest, text: str, inputs: LMInput,
               clock: SentenceClock) -> list[tuple[int, int]]:
        """Each segment's span of `text`, the text it came from (none when nobody asks)."""
        if not clock.wanted:
            return [(0, 0)] * len(inputs.segments)
        prefix = self.family.system_prompt if req.mode == "cross_lingual" else ""
        return segment_spans(text, strip_prefix([s for s, _ in inputs.segments], prefix))

    def _fit(self, inputs: LMInput) -> LMInput:
        """`inputs` cut to fit the LM's context (`fit_context`); SynthesisError if they never can."""
        return fit_context(self.text, self.family, inputs, self.lm_context())

    def _speak(self, inputs: LMInput, flow_prompt: FlowPrompt, req: SynthesisRequest, seed: int,
               first: int = 0, clock: SentenceClock | None = None,
               spans: list[tuple[int, int]] | None = None) -> Iterator[Tensor]:
        """Each text segment through the LM and token2wav, in order; segment i seeded seed + first + i. With a
        `clock`, each segment is a sentence from `spans` (its span of the caller's text)."""
        for i, (segment, text_ids) in enumerate(inputs.segments, first):
            if clock is not None:
                clock.begin(*spans[i - first])
            log.debug("segment %d: %s", i, segment)
            embeds = self._prompt_embeds(text_ids, inputs.prompt_text, inputs.prompt_speech)
            min_len, max_len = self.family.length_limits(len(text_ids))
            # a sentence the flow cannot hold (its fixed noise): the LM is stopped there, with a clear error
            room = stream_room(self.t2w, flow_prompt.tokens.shape[1], req.speed)
            params = dataclasses.replace(self.lm.sampling, greedy=True) if req.greedy else None
            apart = {}  # the utterance's first chunk, for its first packet
            if self.split_first and req.stream and i == 0:
                apart["first"] = self.t2w.first_chunk_tokens(flow_prompt.tokens.shape[1])
            tokens = self.lm.generate(embeds, min_len, min(max_len, room), seed=seed + i, params=params, **apart)
            if max_len > room:
                tokens = _within_room(tokens, room, self.family.token_frame_rate)
            tokens = drop_long_silence(tokens, self.family.tokens)
            yield from self._token2wav(tokens, flow_prompt, req, seed + i, min_len)
            if clock is not None:
                clock.end()

    def _ssml(self, req: SynthesisRequest, speech: list[int], flow_prompt: FlowPrompt,
              seed: int, clock: SentenceClock) -> Iterator[Tensor]:
        """An SSML text: its runs spoken as plain text is (segments numbered on across runs, so a document
        without breaks is its plain text's seeds and segments), each break as exactly that many zero
        samples, at the document's rate (times req.speed) and gain. Runs with nothing to speak (blanks, the
        full stop after a break) are left out by `spoken_runs`, the one rule. Sentences' spans are into the
        document's text content (`Ssml.text`); a break is no sentence. With fixes, into the caller's text (a
        plain text's, through the text controls; a document's text content without them)."""
        doc = req.ssml_document()
        origins: list[Origin] = []
        if clock.wanted and req.fixes:  # (a replacement changed the document's text)
            text, fixed = document_origin(req.text, req.ssml, req.fixes)
            origins = [fixed] if req.ssml else [*clock.origins, fixed]
            if req.ssml:
                clock.text = text
        elif req.ssml:
            clock.text = doc.text
        req = dataclasses.replace(req, speed=req.speed * doc.speed, ssml=False)
        # all of them first: what can never be spoken fails before any audio
        parts: list[Break | tuple[LMInput, list[tuple[int, int]]]] = []
        for part in spoken_runs(doc, self.family.phoneme_tags, req.language):
            if isinstance(part, Break):
                parts.append(part)
                continue
            if part.plain or req.mode == "cross_lingual" and self.family.system_prompt:  # (no normalization)
                inputs = lm_input(self.text, self.family, req.mode, part.text, req.prompt_text, req.instruct_text,
                                  speech)
            else:
                prompt_ids, prompt_speech = lm_prompt(self.text, self.family, req.mode, req.prompt_text,
                                                      req.instruct_text, speech)
                inputs = LMInput(prompt_ids, prompt_speech, self.text.tagged_segments(part.pieces))
            inputs = self._fit(inputs)
            spans = self._spans(req, doc.text[part.begin:part.end], inputs, clock)
            parts.append((inputs, [(part.begin + b, part.begin + e) for b, e in spans]))
        if clock.wanted and origins:  # all at once: consecutive spans, never overlapping
            spans = iter(caller_spans([s for part in parts if not isinstance(part, Break) for s in part[1]],
                                      origins, clock.text))
            parts = [part if isinstance(part, Break) else (part[0], [next(spans) for _ in part[1]])
                     for part in parts]
        n = 0
        for part in parts:
            if isinstance(part, Break):
                yield torch.zeros(part.ms * self.sample_rate // 1000)
                continue
            inputs, spans = part
            for chunk in self._speak(inputs, flow_prompt, req, seed, n, clock, spans):
                yield chunk * doc.volume if doc.volume != 1.0 else chunk
            n += len(inputs.segments)

    def synthesize_duplex(self, req: SynthesisRequest, pieces: Iterable[str],
                          on_text: Callable[[str], None] | None = None,
                          on_mark: Callable[[SentenceMark], None] | None = None) -> Iterator[Tensor]:
        """Yield (N,) float32 audio chunks while text pieces arrive (`pieces` may block, e.g. a queue):
        the text is normalized as it streams (`cosy.text.stream`), the LM decodes each segment of it (a
        sentence, `text_segments`) with the official bistream rules (`cosy.lm.bistream`), seeded seed + i as
        the other surfaces' sentences are, and a streaming token2wav (one voice, one chunk schedule) makes
        the audio of its segments, as many as fit one stream (`token_streams`; a new one, seeded seed + i at
        segment i, starts where the next could outgrow the flow's fixed noise). `req.text` is ignored
        (`req.duplex` must be set). `on_text` is called with each normalized piece as the LM takes it.
        `on_mark` with each segment's "begin" mark before its first chunk and its "end" mark after its last,
        offsets into the pieces as sent, joined (`cosy.pipeline.duplex_marks`: a chunk that holds a segment
        boundary comes in two pieces, with or without `on_mark`)."""
        req.check()
        check_family_language(req.language, self.family.name, self.family.display_name)
        if not req.duplex:
            raise SynthesisError("synthesize_duplex needs a duplex request")
        seed = req.seed if req.seed is not None else random.randrange(2**31)
        features = self._features(req)
        key = _voice_key(features) if req.voice is not None else None
        flow_prompt = FlowPrompt(features.speech_tokens, features.mel, features.embedding, key)
        prompt_text_ids, prompt_speech = lm_prompt(self.text, self.family, req.mode, req.prompt_text,
                                                   req.instruct_text, features.speech_tokens.flatten().tolist())
        caller = CallerText()
        marks = DuplexMarks(self.t2w, req.speed, caller, on_mark)
        # markdown filtered, numbers in the hint's language; the marks map the result back to the pieces as sent
        pieces = streamed_text(caller.record(pieces), req.language, req.markdown, caller.origins)
        decoded = ((i, bistream_decode(marks.segment(i, segment), prompt_text_ids, prompt_speech,
                                       self._bistream_steps(req, seed + i), self.family))
                   for i, segment in enumerate(text_segments(self.text, pieces, on_text, req.fixes)))
        # a stream takes another segment only while the longest one the LM can make still fits it
        longest = self.family.length_limits(LM_DUPLEX_SEGMENT_TOKENS)[1]
        fill = stream_room(self.t2w, flow_prompt.tokens.shape[1], req.speed) - longest
        req = dataclasses.replace(req, stream=True)
        for first, tokens in token_streams(decoded, fill, marks.started):
            marks.new_stream()
            for chunk in self._token2wav(tokens, flow_prompt, req, seed + first):
                yield from marks.cut(chunk)
            marks.end_stream()

    def _bistream_steps(self, req: SynthesisRequest, seed: int):
        params = dataclasses.replace(self.lm.sampling, greedy=True) if req.greedy else self.lm.sampling
        if hasattr(self.lm, "complete"):  # the LM backends: one completion request per segment
            return RemoteSteps(self.lm, self._prompt_embeds.segments, params, seed)
        return EmbeddedSteps(getattr(self.lm, "lm", self.lm), params, seed)  # (unwrapped from a worker's cancel check)

    def _features(self, req: SynthesisRequest) -> PromptFeatures:
        if req.voice is not None:  # a saved voice's stored features serve every mode
            return req.voice
        if req.mode == "voice":
            raise SynthesisError("mode 'voice' needs a saved voice")
        if req.prompt_wav is None:
            raise SynthesisError(f"mode '{req.mode}' needs a prompt audio (prompt_wav)")
        return self.prompts.encode(req.prompt_wav)

    def _token2wav(self, tokens: Iterator[int], prompt: FlowPrompt, req: SynthesisRequest,
                   seed: int, min_tokens: int = 0) -> Iterator[Tensor]:
        """`min_tokens`: how many tokens will surely come (the LM's min_len): the prompt's last chunk is
        computed ahead only for a stream sure to reach its first chunk; a shorter one ends with the final,
        full-attention pass, which recomputes everything, and the early work would be lost."""
        run = self.speech_runner or _run_here
        stream = None
        try:
            if not req.stream:
                ids = list(tokens)
                if ids:
                    tok = torch.tensor([ids], dtype=torch.int32)
                    job = self.t2w.whole_job(tok, prompt, speed=req.speed, seed=seed)
                    yield run(True, lambda: self.t2w(tok, prompt, speed=req.speed, seed=seed),
                              batch=Batch(self.t2w.run_jobs, job, job.frames))
                return
            stream = self.t2w.stream(prompt, speed=req.speed, seed=seed)
            ahead = min_tokens >= stream.first_chunk_tokens
            for token in tokens:
                stream.add([token])
                if ahead and stream.ahead_due():  # the first chunk's prompt part, while the LM makes the rest
                    job = stream.ahead_job()
                    run(True, lambda job=job: stream.compute_ahead(job), batch=Batch(self.t2w.run_chunks, job,
                                                                                    job.frames))
                while stream.due():  # each due chunk: its flow, then its HiFT step (both batchable)
                    first = stream.offset == 0
                    job = stream.chunk_job()
                    mel = run(first, stream.next_mel,
                              batch=None if job is None else Batch(self.t2w.run_chunks, job, job.frames))
                    hift = stream.vocode_job(mel)
                    chunk = run(first, lambda mel=mel: stream.vocode(mel),
                                batch=None if hift is None else Batch(self.t2w.run_vocode, hift, hift.shape[0]))
                    if chunk.numel():
                        yield chunk
            job = stream.finish_job()
            last = run(stream.offset == 0, stream.finish,
                       batch=None if job is None else Batch(self.t2w.run_jobs, job, job.frames))
            if last.numel():
                yield last
        finally:  # the caller went away: stop the LM now (a remote backend aborts the request)
            try:
                if stream is not None:
                    stream.close()
            finally:  # even if a cancel's interrupt lands in stream.close()
                close = getattr(tokens, "close", None)
                if close:
                    close()


def _within_room(tokens: Iterator[int], room: int, rate: int) -> Iterator[int]:
    """`tokens`, but SynthesisError once the LM has made `room` of them (the most one utterance's flow holds
    after this voice prompt: `stream_room`) without stopping. The official code fails there too (its fixed
    noise is shorter than the mel); a sentence that long has no punctuation to split it at."""
    n = 0
    try:
        for token in tokens:
            n += 1
            if n >= room:
                raise SynthesisError(f"a sentence of the text is too long to speak in one piece: its speech reached "
                                     f"{room / rate:.0f} s, the most one utterance holds with this voice prompt; "
                                     "split it with punctuation (。！？.!?)")
            yield token
    finally:  # stop the LM now (a remote backend aborts the request)
        close = getattr(tokens, "close", None)
        if close:
            close()


def _embedded_context() -> int:
    """The embedded LM's context: its documented limit, as the frontend's request checks count it."""
    return EMBEDDED_LM_MAX_LEN


def _run_here(first: bool, fn, batch=None):
    return fn()


def _voice_key(features: PromptFeatures) -> str:
    h = hashlib.sha1()
    for t in (features.speech_tokens, features.mel, features.embedding):
        h.update(t.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def _load16k(source: object) -> Tensor:
    if source is None:
        raise SynthesisError("mode 'vc' needs the speech to convert (source_wav)")
    return load_prompt_wav(source, 16000)
