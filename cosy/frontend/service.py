"""What every frontend surface (WebUI, gradio_client API, HTTP APIs) asks of this instance.

One `FrontendService` per process: the worker pool (synthesis), the shared data dir (uploads, saved
voices) and the synthesis metrics of every surface. Surfaces hand it a `SynthesisRequest` and the name of
the surface; failures are `cosy.errors.CosyError`s whose `status` the surface answers with.

Priorities: a request that names no class gets its surface's default (`default_priority`: streams
interactive, whole files default, batch bulk); it may always ask for a less urgent class, and for a more
urgent one only where the operator allows it (`allow_priority`, `--allow_priority`).
"""
from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path

import numpy as np

from cosy.deploy.data_dir import DataDir
from cosy.deploy.voices import check_voice_id
from cosy.errors import CosyError
from cosy.frontend.metrics import Metrics
from cosy.frontend.qos import Playback
from cosy.model.family import ModelFamily
from cosy.model.files import ModelDir
from cosy.pipeline.request import (
    EMBEDDED_LM_MAX_LEN,
    MAX_PROMPT_TEXT_CHARS,
    PRIORITIES,
    SERVED_MODES,
    SynthesisError,
    SynthesisRequest,
    check_lm_budget,
    check_priority,
    check_text,
    default_priority,
    priority_rank,
)
from cosy.pipeline.timing import SentenceMark, SentenceTiming
from cosy.service.job_queue import JobTrace
from cosy.service.workers import WorkerPool
from cosy.text.control import plain_text
from cosy.text.language import check_family_language
from cosy.text.lexicon import request_fixes
from cosy.text.ssml_text import spoken_runs

SURFACES = ("webui", "gradio_api", "pai", "openai")


def parse_priorities(value: str) -> frozenset[str]:
    """`--allow_priority`: comma-separated classes of PRIORITIES (empty: none); ValueError naming the bad one."""
    names = frozenset(n.strip() for n in value.split(",") if n.strip())
    for name in names:
        if name not in PRIORITIES:
            raise ValueError(f"--allow_priority: unknown class {name!r} (choose from {', '.join(PRIORITIES)})")
    return names


@dataclass
class SynthesisResult:
    audio: np.ndarray  # (N,) float32
    sample_rate: int
    seconds: float  # wall time
    # each sentence spoken, in order, with its exact samples in `audio` and its span of the caller's text
    # (`cosy.pipeline.timing`); they tile the audio but for SSML breaks; empty for voice conversion
    sentences: list[SentenceTiming] = field(default_factory=list)


# what a request for word timings hears from a frontend without an aligner (400)
WORDS_NEED_ALIGNER = ("word timestamps (word_timestamp_enabled) need a forced aligner, and this frontend has none: "
                      "start it with --aligner MODEL_DIR, or ask for sentence timestamps only")


class FrontendService:
    def __init__(self, pool: WorkerPool, data_dir: DataDir):
        self.pool, self.data = pool, data_dir
        self.metrics = Metrics(pool.stats, lambda: pool.max_queue)
        # the LM's context in tokens: the embedded LM's documented limit, or the backends' max_model_len
        # (`cosy.frontend.server` reads it from their /v1/models at start-up); None = not known yet
        self.lm_max_len: int | None = None if pool.spec.llm_base_url else EMBEDDED_LM_MAX_LEN
        self.ws_idle_timeout = 60.0  # seconds (--ws_idle_timeout; cosy.frontend.ws_tasks)
        # the classes a client may ask for above its request's default (--allow_priority); a lower one it always may
        self.allow_priority: frozenset[str] = frozenset()

    @property
    def sample_rate(self) -> int:
        return self.pool.sample_rate

    @cached_property
    def family(self) -> ModelFamily:
        """The model family the workers serve (token rate, ids, names)."""
        return ModelDir(self.pool.spec.model_dir).family

    @property
    def model_label(self) -> str:
        """What this frontend serves, for pages and logs: "CosyVoice3 (Fun-CosyVoice3-0.5B-2512) · LM llm.rl.pt"."""
        spec = self.pool.spec
        return (f"{self.family.display_name} ({Path(spec.model_dir).name}) · "
                f"LM {self.family.files.llm_file(spec.llm_variant)}")

    def resolve(self, req: SynthesisRequest) -> SynthesisRequest:
        """Checked, with a saved voice's stored features in place of `voice_id` (no ONNX work per request;
        mode 'voice' also takes the voice's transcript as prompt text)."""
        req.check()
        check_family_language(req.language, self.family.name, self.family.display_name)
        if req.word_timestamps and not self.pool.spec.aligner:
            raise SynthesisError(WORDS_NEED_ALIGNER)
        # pronunciation fixes: the request's hot_fix and the shared lexicon, as read now (`request_fixes`)
        # (chosen on the text the engine applies them to: after the markdown filter and a hint's readings)
        fixed = None if req.duplex else req.text if req.ssml else plain_text(req.text, req.language, req.markdown)
        req = replace(req, fixes=request_fixes(req.hot_fix, self.data.lexicon.entries(), self.family.phoneme_tags,
                                               fixed, req.ssml))
        if (req.ssml or req.fixes) and not req.duplex:  # what the workers' family cannot read (<phoneme> on
            spoken_runs(req.ssml_document(), self.family.phoneme_tags, req.language)  # CosyVoice2) is a 400 now
        if req.mode not in SERVED_MODES:
            raise SynthesisError(f"unknown mode {req.mode!r} (choose from {', '.join(SERVED_MODES)})")
        if req.mode == "voice" and not req.voice_id:
            raise SynthesisError("choose a saved voice (voice_id)")
        if not req.voice_id:
            check_lm_budget(req, self.lm_max_len)
            return req
        voice = self.data.voices.load(req.voice_id, family=self.family.name)
        prompt_text = voice.prompt_text if req.mode == "voice" else req.prompt_text
        out = replace(req, voice=voice.features, prompt_wav=None, prompt_text=prompt_text)
        check_lm_budget(out, self.lm_max_len, int(voice.features.speech_tokens.numel()))
        return out

    def priority_of(self, req: SynthesisRequest, surface: str) -> str:
        """The class `req` is served at: the one it asks for, or its surface's default (`default_priority`). A
        class more urgent than the default only where `allow_priority` has it; else SynthesisError (400)."""
        default = default_priority(surface, req.stream or req.duplex)
        asked = check_priority(req.priority)
        if asked is None:
            return default
        if priority_rank(asked) >= priority_rank(default) or asked in self.allow_priority:
            return asked
        allowed = [p for p in PRIORITIES if priority_rank(p) >= priority_rank(default) or p in self.allow_priority]
        raise SynthesisError(f"priority {asked!r} is more urgent than this request's default ({default!r}), and this "
                             f"frontend does not let clients raise it (--allow_priority): choose one of "
                             f"{', '.join(allowed)}, or leave priority out")

    def check_transcript(self, prompt_text: str, name: str = "prompt_text") -> str:
        """A voice prompt's transcript that the LM can take (with one sentence to speak); SynthesisError
        naming the field `name`."""
        check_text(prompt_text, name, MAX_PROMPT_TEXT_CHARS)
        try:
            check_lm_budget(SynthesisRequest(mode="voice", text="x", prompt_text=prompt_text), self.lm_max_len)
        except SynthesisError as e:
            raise SynthesisError(str(e).replace("prompt_text", name)) from None
        return prompt_text

    def stream(self, req: SynthesisRequest, surface: str, received: float | None = None,
               cancelled: threading.Event | None = None, text: queue.Queue | None = None,
               on_text: Callable[[str], None] | None = None,
               on_sentence: Callable[[SentenceMark], None] | None = None) -> Iterator[np.ndarray]:
        """Audio chunks (float32, `sample_rate`) as the workers make them, at the request's priority class
        (`priority_of`); metrics under (surface, mode) and, for quality of service, (class, surface).
        Setting `cancelled` (from any thread) cancels the job at once, even while it waits in the queue.
        `text`: a duplex request's text pieces (str; None ends the text), `on_text` the normalized text its LM
        takes, see `WorkerPool.synthesize_duplex`. `on_sentence` is called, on the thread reading this
        iterator, with each sentence's "begin" mark before its first chunk is yielded and its "end" mark
        after its last chunk is yielded (before the next chunk, or the iterator's end): exact samples
        counted from this stream's start, offsets into the caller's text (`cosy.pipeline.timing`)."""
        received = time.monotonic() if received is None else received
        m, labels = self.metrics, (surface, req.mode)
        seconds, chunks = 0.0, 0
        trace = JobTrace()
        play = Playback(received) if req.stream or text is not None else None  # a stream: as its listener hears it
        try:
            req = replace(req, priority=self.priority_of(req, surface))
            qos = (req.priority, surface)  # the series' labels (class, api)
            source = (self.pool.synthesize(self.resolve(req), cancelled, trace, on_mark=on_sentence) if text is None
                      else self.pool.synthesize_duplex(self.resolve(req), text, cancelled, on_text, trace,
                                                       on_mark=on_sentence))
            for chunk in source:
                now = time.monotonic()
                if not chunks:
                    m.first_packet.labels(*labels).observe(now - received)
                chunks += 1
                seconds += len(chunk) / self.sample_rate
                if play is not None:
                    play.chunk(now, len(chunk) / self.sample_rate)
                    if play.gaps:
                        m.chunk_gap.labels(*qos).observe(play.gaps[-1])
                    else:
                        m.stream_first_packet.labels(*qos).observe(play.first_packet)
                yield chunk
        except CosyError as e:
            m.failed(surface, req.mode, e.status, after_audio=chunks > 0)
            raise
        finally:
            if trace.queue_wait is not None:  # it reached a worker (so its class is known)
                m.queue_wait.labels(*qos).observe(trace.queue_wait)
        wall = time.monotonic() - received
        m.finished(surface, req.mode, wall, seconds)
        if play is not None:
            m.stream_finished(*qos, play)
        if self.pool.spec.llm_base_url and trace.backend_seconds is not None and wall > 0:
            m.backend_share.labels(*qos).observe(min(1.0, trace.backend_seconds / wall))

    def synthesize(self, req: SynthesisRequest, surface: str,
                   cancelled: threading.Event | None = None) -> SynthesisResult:
        """The whole utterance at once (non-streaming synthesis), with its sentences' timings; setting
        `cancelled` cancels it."""
        start = time.monotonic()
        sentences: list[SentenceTiming] = []

        def ended(mark: SentenceMark) -> None:
            if mark.kind == "end":
                sentences.append(mark.sentence)

        chunks = list(self.stream(replace(req, stream=False), surface, start, cancelled, on_sentence=ended))
        audio = np.concatenate(chunks) if chunks else np.zeros(0, np.float32)
        return SynthesisResult(audio, self.sample_rate, time.monotonic() - start, sentences)

    def save_voice(self, voice_id: str, prompt_text: str, prompt_wav: str | Path | None,
                   overwrite: bool = False, cancelled: threading.Event | None = None,
                   meta: dict | None = None) -> dict:
        """Compute a prompt's features once (in a worker) and store them as a saved voice; setting
        `cancelled` cancels the computation. `meta`: what the surface knows of it (created_by, consent,
        preprocess: `cosy.deploy.voices.META_FIELDS`); prompt_seconds is recorded here."""
        if not prompt_wav:
            raise SynthesisError("a saved voice needs a prompt audio")
        if not (prompt_text or "").strip():
            raise SynthesisError("a saved voice needs the prompt's transcript (prompt_text)")
        check_voice_id(voice_id)
        self.check_transcript(prompt_text)
        features = self.pool.prompt_features(str(prompt_wav), cancelled)
        v = self.data.voices.save(voice_id, prompt_text.strip(), features, overwrite=overwrite,
                                  family=self.family.name, meta={**(meta or {}), **self._seconds(features)})
        return {"voice_id": v.voice_id, "prompt_text": v.prompt_text, "created_at": v.created_at}

    def _seconds(self, features) -> dict:
        """The prompt's duration, from its speech tokens (one per 1/token_frame_rate s)."""
        return {"prompt_seconds": round(int(features.speech_tokens.numel()) / self.family.token_frame_rate, 2)}

    def update_voice(self, voice_id: str, *, new_id: str | None = None, prompt_text: str | None = None,
                     prompt_wav: str | Path | None = None, cancelled: threading.Event | None = None,
                     meta: dict | None = None) -> dict:
        """Rename a saved voice and/or give it a new transcript or prompt audio (features computed by this
        frontend's model, so the voice then belongs to its family); its listing."""
        if prompt_text is not None:
            self.check_transcript(prompt_text)
            prompt_text = prompt_text.strip()
        features = self.pool.prompt_features(str(prompt_wav), cancelled) if prompt_wav else None
        extra = {**(meta or {}), **(self._seconds(features) if features is not None else {})}
        v = self.data.voices.update(voice_id, new_id=new_id, prompt_text=prompt_text, features=features,
                                    family=self.family.name if features is not None else None, meta=extra)
        return self.data.voices.listing(v.voice_id)

    def list_voices(self) -> list[dict]:
        return self.data.voices.list()

    def delete_voice(self, voice_id: str) -> None:
        self.data.voices.delete(voice_id)
