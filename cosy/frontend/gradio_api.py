"""The gradio_client API: typed `gr.api` endpoints over `FrontendService`, and the glue the WebUI shares.

    from gradio_client import Client, handle_file
    client = Client("http://host:50000/")
    wav_path = client.predict("你好。", "希望你以后能够做的比我还好呦。", handle_file("me.wav"), 0, 1.0,
                              api_name="/zero_shot")

`/zero_shot`, `/cross_lingual`, `/instruct` and `/saved_voice` return a 24 kHz wav file (the client
downloads it); each takes `hot_fix` last (pronunciation fixes as JSON, the managed service's shape: `cosy.text.lexicon`;
"" none). `/save_voice` and `/list_voices` return JSON. `/speak_with_timestamps` speaks in any of those
modes and returns the wav, its sentence timings as JSON (`{"text", "sentences"}`: docs/api/timestamps.md) and
a subtitle file (SRT or VTT). Uploaded prompts are copied into the data
dir (content-addressed), so every frontend sharing it sees them. Errors raise `gr.Error` with the
service's message: the client raises it with that text as written (not HTML-escaped: only the WebUI renders
it as HTML), never with a stack trace.

A caller that leaves (its event stream closed: a killed gradio_client, a raw `/gradio_api/call/<name>`
whose GET is abandoned) cancels its job in the worker pool at once, queued or running: gradio itself only
marks the event dead (`Event.alive`) and lets a running function finish, so each endpoint watches its own
event (`left_watch`) and sets the job's cancel event when gradio gives it up.
"""
# no `from __future__ import annotations`: gr.api reads the endpoint type hints as real types
import atexit
import html
import logging
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import gradio as gr
import numpy as np
from gradio import FileData
from gradio.utils import get_upload_folder, is_in_or_equal

from cosy.errors import BadRequest, CosyError, JobError, public_message
from cosy.frontend import gradio_compat, store
from cosy.frontend.encoding import wav_bytes
from cosy.frontend.service import FrontendService
from cosy.pipeline.request import SynthesisRequest, as_number, clean_filename
from cosy.pipeline.subtitles import FORMATS as SUBTITLE_FORMATS
from cosy.pipeline.subtitles import subtitles
from cosy.pipeline.timing import SentenceTiming
from cosy.text.lexicon import parse_hot_fix

log = logging.getLogger(__name__)
OUT_DIR = store.RESULTS  # gradio serves only temp/cwd files; gradio copies results into its own cache
RESULT_BOUNDS = store.DEFAULT_RESULTS  # app.py sets it from --results_max_age / --results_max_mb
atexit.register(store.remove_temp_root)


@contextmanager
def user_errors(as_html: bool = True) -> Iterator[None]:
    """Turn every failure into a `gr.Error` with a message fit for a user (never a stack trace). `as_html`:
    the message is shown by the WebUI, which renders it as HTML, so markup it quotes (user input, SSML tags)
    is escaped; the API endpoints' callers (gradio_client) get it as written."""
    try:
        yield
    except gr.Error:
        raise
    except CosyError as e:
        if e.status >= 500:
            log.warning("answering %d: %s", e.status, e)
        message = public_message(str(e))  # never a server path or a backend's URL
        raise gr.Error(html.escape(message, quote=False) if as_html else message, print_exception=False) from None
    except Exception:  # a bug or a broken worker: details go to the server log only
        log.exception("request failed")
        raise gr.Error("internal error while handling the request; the server log has the details",
                       print_exception=False) from None


def _audio_refused(e: BaseException) -> bool:
    """The error says the uploaded audio itself is bad (not the text, not a busy server)."""
    kind = e.kind if isinstance(e, JobError) else type(e).__name__
    return kind == "AudioError" or (isinstance(e, CosyError) and e.status in (413, 415))


class _Uploads:
    """The uploads one request stored (data dir copy, gradio's copy, whether this request created the
    data dir copy); see `refused_uploads_removed`."""

    def __init__(self):
        self.items: list[tuple[Path | None, Path, bool]] = []

    def discard(self, e: BaseException) -> None:
        if not isinstance(e, CosyError) or not 400 <= e.status < 500:
            return  # ours or a dependency's failure: the upload may be fine; the store bounds apply
        audio = _audio_refused(e)
        for stored, original, created in self.items:
            if stored is not None and (created or audio):
                stored.unlink(missing_ok=True)
            if audio and is_in_or_equal(str(original), get_upload_folder()) and not store.pinned(original):
                original.unlink(missing_ok=True)  # gradio's own temp copy: of no use to anyone (not an example's)


@contextmanager
def refused_uploads_removed() -> Iterator[_Uploads]:
    """Inside: pass the yielded object to `stored_upload(..., track=)`; when the request is refused (a 4xx)
    the uploads it stored are deleted at once: the data dir copy if this request created it or the audio
    was refused, gradio's temp copy when the audio was refused."""
    uploads = _Uploads()
    try:
        yield uploads
    except BaseException as e:
        uploads.discard(e)
        raise


def stored_upload(service: FrontendService, path: str | None, filename: str | None = None,
                  track: _Uploads | None = None) -> Path | None:
    """Copy an upload that gradio received into the data dir; the data dir path, or None without a file.

    Only files inside gradio's upload folder are read: a client cannot name an arbitrary server file.
    A refused upload (too large, wrong type) is deleted from gradio's folder at once."""
    if not path:
        return None
    if not is_in_or_equal(path, get_upload_folder()):
        raise BadRequest("prompt_wav must be an uploaded file (gradio_client: handle_file(path))")
    try:
        data = Path(path).read_bytes()
    except OSError:
        raise BadRequest("the uploaded prompt audio could not be read; upload it again") from None
    name = clean_filename(filename or Path(path).name)
    try:
        target = service.data.upload_path(data, name)
    except CosyError:
        Path(path).unlink(missing_ok=True)
        raise
    created = not target.is_file()
    stored = service.data.save_upload(data, name)
    if track is not None:
        track.items.append((stored, Path(path), created))
    return stored


def uploaded(service: FrontendService, value: object, track: _Uploads | None = None) -> Path | None:
    """An API file parameter (FileData as a dict, after gradio's upload checks) -> data dir path."""
    if value is None:
        return None
    if isinstance(value, FileData):
        value = value.model_dump()
    if not isinstance(value, dict) or not value.get("path"):  # a bare string would be a server path
        raise BadRequest("prompt_wav must be an uploaded file (gradio_client: handle_file(path))")
    return stored_upload(service, str(value["path"]), value.get("orig_name"), track)


def wav_file(audio: np.ndarray, sample_rate: int, stem: str) -> str:
    """Write a result wav (16-bit) for gradio to pick up; old results are pruned on the way."""
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    path = OUT_DIR / f"{stem}-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}.wav"
    path.write_bytes(wav_bytes(audio, sample_rate))
    store.prune(OUT_DIR, RESULT_BOUNDS, keep=path)
    return str(path)


WATCH_INTERVAL = 0.1  # seconds between looks at whether gradio still has a listener for the event


def _own_events(blocks, request, api_name: str) -> list:
    """gradio's running events of this request's session for endpoint `api_name` (normally one)."""
    queue = getattr(blocks, "_queue", None)
    session = getattr(request, "session_hash", None) if request is not None else None
    if queue is None or not session:
        return []
    jobs = list(getattr(queue, "active_jobs", None) or ())
    return [e for job in jobs if job for e in list(job)
            if getattr(e, "session_hash", None) == session
            and getattr(getattr(e, "fn", None), "api_name", None) == api_name]


@contextmanager
def left_watch(blocks, request, api_name: str) -> Iterator[threading.Event | None]:
    """Inside: an event that is set once gradio gives up this call's event(s) (the client closed its
    event stream; gradio sets `alive = False`), to cancel the job in the pool; None when the call did not
    come through gradio's queue (nothing to watch)."""
    events = _own_events(blocks, request, api_name)
    if not events:
        yield None
        return
    left, done = threading.Event(), threading.Event()

    def watch() -> None:
        while not done.wait(WATCH_INTERVAL):
            if not any(getattr(e, "alive", True) for e in events):
                left.set()
                return

    thread = threading.Thread(target=watch, daemon=True, name=f"watch-{api_name}")
    thread.start()
    try:
        yield left
    finally:
        done.set()


def _synthesize(service: FrontendService, mode: str, seed: object, speed: object, prompt_wav: object = None,
                cancelled: threading.Event | None = None, hot_fix: object = "", **fields) -> FileData:
    """`hot_fix`: pronunciation fixes as JSON (`cosy.text.lexicon.parse_hot_fix`; "" none)."""
    with user_errors(as_html=False), refused_uploads_removed() as track:
        fixes = parse_hot_fix(hot_fix)
        req = SynthesisRequest(mode=mode, prompt_wav=uploaded(service, prompt_wav, track),
                               seed=as_number(seed, "seed", int), speed=as_number(speed, "speed"), hot_fix=fixes,
                               **fields)
        result = service.synthesize(req, "gradio_api", cancelled)
        return FileData(path=wav_file(result.audio, result.sample_rate, f"cosy-{mode}"))


def _text_controls(language_hints: object, markdown: object) -> dict:
    """The request fields of the trailing `language_hints` ("" none; "de", or a list) and
    `enable_markdown_filter` parameters (docs/api/text-control.md)."""
    return {"language": language_hints or None, "markdown": bool(markdown)}


# `/speak_with_timestamps`'s modes, named as the endpoints of each mode -> the service's modes
TIMED_MODES = {"zero_shot": "zero_shot", "cross_lingual": "cross_lingual", "instruct": "instruct",
               "saved_voice": "voice"}


def indexed_text(req: SynthesisRequest) -> str:
    """The text that sentence offsets (begin_index, end_index) index: the caller's text, or an SSML document's
    text content."""
    return req.ssml_document().text if req.ssml else req.text


def subtitle_format(value: object) -> str:
    """One of SUBTITLE_FORMATS (any case); BadRequest naming subtitle_format otherwise."""
    fmt = value.strip().lower() if isinstance(value, str) else value
    if fmt not in SUBTITLE_FORMATS:
        raise BadRequest(f"subtitle_format {value!r} is not a subtitle format: use {' or '.join(SUBTITLE_FORMATS)}")
    return fmt


def subtitle_file(sentences: list[SentenceTiming], fmt: str, stem: str) -> str:
    """Write the sentences as a subtitle file of format `fmt` (SUBTITLE_FORMATS) beside the results."""
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    path = OUT_DIR / f"{stem}-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}.{fmt}"
    path.write_text(subtitles(sentences, fmt), encoding="utf-8")
    store.prune(OUT_DIR, RESULT_BOUNDS, keep=path)
    return str(path)


def _timed(service: FrontendService, mode: str, tts_text: str, voice_id: str, prompt_wav: object, prompt_text: str,
           instruct_text: str, seed: object, speed: object, ssml: bool, words: bool, fmt_asked: str,
           cancelled: threading.Event | None) -> tuple[FileData, dict, FileData]:
    with user_errors(as_html=False), refused_uploads_removed() as track:
        if mode not in TIMED_MODES:
            raise BadRequest(f"mode {mode!r} is not one of {', '.join(TIMED_MODES)}")
        fmt = subtitle_format(fmt_asked)  # refused before any synthesis
        saved = mode == "saved_voice"
        req = SynthesisRequest(mode=TIMED_MODES[mode], text=tts_text, voice_id=(voice_id or None) if saved else None,
                               prompt_wav=None if saved else uploaded(service, prompt_wav, track),
                               prompt_text=prompt_text if mode == "zero_shot" else "",
                               instruct_text=instruct_text if mode == "instruct" else "",
                               seed=as_number(seed, "seed", int), speed=as_number(speed, "speed"), ssml=ssml,
                               word_timestamps=words)
        result = service.synthesize(req, "gradio_api", cancelled)
        stem = f"cosy-{mode}"
        timings = {"text": indexed_text(req), "sentences": [s.to_dict(words) for s in result.sentences]}
        return (FileData(path=wav_file(result.audio, result.sample_rate, stem)), timings,
                FileData(path=subtitle_file(result.sentences, fmt, stem)))


def register(service: FrontendService) -> None:
    """Add the API endpoints to the Blocks being built (call inside `with blocks:`)."""
    from gradio.context import Context
    blocks = Context.root_block  # its queue knows whether a call's client is still there

    def zero_shot(tts_text: str, prompt_text: str, prompt_wav: FileData, seed: int = 0,
                  speed: float = 1.0, enable_ssml: bool = False, hot_fix: str = "",
                  language_hints: str = "", enable_markdown_filter: bool = False,
                  request: gr.Request = None) -> FileData:
        """3s极速复刻 Zero-shot clone: speak tts_text in the voice of prompt_wav (3-30 s), whose transcript
        is prompt_text. Returns a 24 kHz wav."""
        with left_watch(blocks, request, "zero_shot") as left:
            return _synthesize(service, "zero_shot", seed, speed, prompt_wav, left, hot_fix, text=tts_text,
                               prompt_text=prompt_text, ssml=bool(enable_ssml),
                               **_text_controls(language_hints, enable_markdown_filter))

    def cross_lingual(tts_text: str, prompt_wav: FileData, seed: int = 0, speed: float = 1.0,
                      enable_ssml: bool = False, hot_fix: str = "",
                      language_hints: str = "", enable_markdown_filter: bool = False,
                      request: gr.Request = None) -> FileData:
        """跨语种复刻 Cross-lingual: the voice of prompt_wav (any language, no transcript) speaking tts_text.
        Returns a 24 kHz wav."""
        with left_watch(blocks, request, "cross_lingual") as left:
            return _synthesize(service, "cross_lingual", seed, speed, prompt_wav, left, hot_fix, text=tts_text,
                               ssml=bool(enable_ssml),
                               **_text_controls(language_hints, enable_markdown_filter))

    def instruct(tts_text: str, instruct_text: str, prompt_wav: FileData, seed: int = 0,
                 speed: float = 1.0, enable_ssml: bool = False, hot_fix: str = "",
                 language_hints: str = "", enable_markdown_filter: bool = False,
                 request: gr.Request = None) -> FileData:
        """自然语言控制 Instruct: the voice of prompt_wav speaking tts_text as instruct_text asks (e.g.
        用四川话说这句话, Speak slowly and softly). Returns a 24 kHz wav."""
        with left_watch(blocks, request, "instruct") as left:
            return _synthesize(service, "instruct", seed, speed, prompt_wav, left, hot_fix, text=tts_text,
                               instruct_text=instruct_text, ssml=bool(enable_ssml),
                               **_text_controls(language_hints, enable_markdown_filter))

    def saved_voice(tts_text: str, voice_id: str, seed: int = 0, speed: float = 1.0,
                    enable_ssml: bool = False, hot_fix: str = "",
                    language_hints: str = "", enable_markdown_filter: bool = False,
                    request: gr.Request = None) -> FileData:
        """预设音色 Saved voice: speak tts_text with a voice saved earlier (/save_voice). Returns a 24 kHz
        wav."""
        with left_watch(blocks, request, "saved_voice") as left:
            return _synthesize(service, "voice", seed, speed, None, left, hot_fix, text=tts_text, voice_id=voice_id,
                               ssml=bool(enable_ssml),
                               **_text_controls(language_hints, enable_markdown_filter))

    def save_voice(voice_id: str, prompt_text: str, prompt_wav: FileData, request: gr.Request = None) -> dict:
        """Save prompt_wav and its transcript as voice voice_id, shared by every frontend on this data
        dir. Returns {voice_id, prompt_text, created_at}."""
        with left_watch(blocks, request, "save_voice") as left, user_errors(as_html=False), \
                refused_uploads_removed() as track:
            return service.save_voice(voice_id, prompt_text, uploaded(service, prompt_wav, track),
                                      cancelled=left)

    def list_voices() -> list[dict]:
        """The saved voices, newest first: [{voice_id, prompt_text, created_at, family}] (family: the model
        family that saved it, e.g. cosyvoice2; a voice serves only models of its family)."""
        with user_errors(as_html=False):
            return service.list_voices()

    def speak_with_timestamps(tts_text: str, mode: str = "saved_voice", voice_id: str = "",
                              prompt_wav: FileData = None, prompt_text: str = "", instruct_text: str = "",
                              seed: int = 0, speed: float = 1.0, enable_ssml: bool = False,
                              word_timestamp_enabled: bool = False, subtitle_format: str = "srt",
                              request: gr.Request = None) -> tuple[FileData, dict, FileData]:
        """Speak tts_text in mode zero_shot (prompt_wav + prompt_text), cross_lingual (prompt_wav), instruct
        (prompt_wav + instruct_text) or saved_voice (voice_id), and say when each sentence is spoken. Returns
        the 24 kHz wav, {"text": what the offsets index, "sentences": [{index, text, begin_time, end_time (ms),
        begin_index, end_index}]} (with "words" when word_timestamp_enabled: needs the frontend's --aligner) and
        a subtitle file (subtitle_format srt or vtt)."""
        with left_watch(blocks, request, "speak_with_timestamps") as left:
            return _timed(service, mode, tts_text, voice_id, prompt_wav, prompt_text, instruct_text, seed, speed,
                          bool(enable_ssml), bool(word_timestamp_enabled), subtitle_format, left)

    for fn in (zero_shot, cross_lingual, instruct, saved_voice, save_voice, list_voices, speak_with_timestamps):
        gr.api(fn, api_name=fn.__name__)
        gradio_compat.note(fn, fn.__name__)  # raw calls without the later `enable_ssml` still work
