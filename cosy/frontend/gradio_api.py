"""The gradio_client API: typed `gr.api` endpoints over `FrontendService`, and the glue the WebUI shares.

    from gradio_client import Client, handle_file
    client = Client("http://host:50000/")
    wav_path = client.predict("你好。", "希望你以后能够做的比我还好呦。", handle_file("me.wav"), 0, 1.0,
                              api_name="/zero_shot")

`/zero_shot`, `/cross_lingual`, `/instruct` and `/saved_voice` return a 24 kHz wav file (the client
downloads it); `/save_voice` and `/list_voices` return JSON. Uploaded prompts are copied into the data
dir (content-addressed), so every frontend sharing it sees them. Errors raise `gr.Error` with the
service's message: the client raises it with that text, never with a stack trace.
"""
# no `from __future__ import annotations`: gr.api reads the endpoint type hints as real types
import atexit
import html
import logging
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import gradio as gr
import numpy as np
from gradio import FileData
from gradio.utils import get_upload_folder, is_in_or_equal

from cosy.errors import BadRequest, CosyError, public_message
from cosy.frontend.encoding import wav_bytes
from cosy.frontend.service import FrontendService
from cosy.pipeline.request import SynthesisRequest, as_number, clean_filename

log = logging.getLogger(__name__)
OUT_DIR = Path(tempfile.gettempdir()) / f"cosy-frontend-{os.getpid()}"  # gradio serves only temp/cwd files
OUT_MAX_AGE = 600.0  # seconds; gradio copies results into its own cache, ours are only a hand-over
atexit.register(shutil.rmtree, OUT_DIR, ignore_errors=True)


@contextmanager
def user_errors() -> Iterator[None]:
    """Turn every failure into a `gr.Error` with a message fit for a user (never a stack trace)."""
    try:
        yield
    except gr.Error:
        raise
    except CosyError as e:
        if e.status >= 500:
            log.warning("answering %d: %s", e.status, e)
        # never a server path or a backend's URL (public_message); the WebUI renders the message as HTML
        # and it may quote user input
        raise gr.Error(html.escape(public_message(str(e)), quote=False), print_exception=False) from None
    except Exception:  # a bug or a broken worker: details go to the server log only
        log.exception("request failed")
        raise gr.Error("internal error while handling the request; the server log has the details",
                       print_exception=False) from None


def stored_upload(service: FrontendService, path: str | None, filename: str | None = None) -> Path | None:
    """Copy an upload that gradio received into the data dir; the data dir path, or None without a file.

    Only files inside gradio's upload folder are read: a client cannot name an arbitrary server file."""
    if not path:
        return None
    if not is_in_or_equal(path, get_upload_folder()):
        raise BadRequest("prompt_wav must be an uploaded file (gradio_client: handle_file(path))")
    try:
        data = Path(path).read_bytes()
    except OSError:
        raise BadRequest("the uploaded prompt audio could not be read; upload it again") from None
    return service.data.save_upload(data, clean_filename(filename or Path(path).name))


def uploaded(service: FrontendService, value: object) -> Path | None:
    """An API file parameter (FileData as a dict, after gradio's upload checks) -> data dir path."""
    if value is None:
        return None
    if isinstance(value, FileData):
        value = value.model_dump()
    if not isinstance(value, dict) or not value.get("path"):  # a bare string would be a server path
        raise BadRequest("prompt_wav must be an uploaded file (gradio_client: handle_file(path))")
    return stored_upload(service, str(value["path"]), value.get("orig_name"))


def wav_file(audio: np.ndarray, sample_rate: int, stem: str) -> str:
    """Write a result wav (16-bit) for gradio to pick up; old results are pruned on the way."""
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    now = time.time()
    for old in OUT_DIR.iterdir():
        try:
            if now - old.stat().st_mtime > OUT_MAX_AGE:
                old.unlink()
        except OSError:
            pass  # pruned by a concurrent request
    path = OUT_DIR / f"{stem}-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}.wav"
    path.write_bytes(wav_bytes(audio, sample_rate))
    return str(path)


def _synthesize(service: FrontendService, mode: str, seed: object, speed: object, prompt_wav: object = None,
                **fields) -> FileData:
    with user_errors():
        req = SynthesisRequest(mode=mode, prompt_wav=uploaded(service, prompt_wav), seed=as_number(seed, "seed", int),
                               speed=as_number(speed, "speed"), **fields)
        result = service.synthesize(req, "gradio_api")
        return FileData(path=wav_file(result.audio, result.sample_rate, f"cosy-{mode}"))


def register(service: FrontendService) -> None:
    """Add the API endpoints to the Blocks being built (call inside `with blocks:`)."""

    def zero_shot(tts_text: str, prompt_text: str, prompt_wav: FileData, seed: int = 0,
                  speed: float = 1.0) -> FileData:
        """3s极速复刻 Zero-shot clone: speak tts_text in the voice of prompt_wav (3-30 s), whose transcript
        is prompt_text. Returns a 24 kHz wav."""
        return _synthesize(service, "zero_shot", seed, speed, prompt_wav, text=tts_text, prompt_text=prompt_text)

    def cross_lingual(tts_text: str, prompt_wav: FileData, seed: int = 0, speed: float = 1.0) -> FileData:
        """跨语种复刻 Cross-lingual: the voice of prompt_wav (any language, no transcript) speaking tts_text.
        Returns a 24 kHz wav."""
        return _synthesize(service, "cross_lingual", seed, speed, prompt_wav, text=tts_text)

    def instruct(tts_text: str, instruct_text: str, prompt_wav: FileData, seed: int = 0,
                 speed: float = 1.0) -> FileData:
        """自然语言控制 Instruct: the voice of prompt_wav speaking tts_text as instruct_text asks (e.g.
        用四川话说这句话, Speak slowly and softly). Returns a 24 kHz wav."""
        return _synthesize(service, "instruct", seed, speed, prompt_wav, text=tts_text, instruct_text=instruct_text)

    def saved_voice(tts_text: str, voice_id: str, seed: int = 0, speed: float = 1.0) -> FileData:
        """预设音色 Saved voice: speak tts_text with a voice saved earlier (/save_voice). Returns a 24 kHz
        wav."""
        return _synthesize(service, "voice", seed, speed, text=tts_text, voice_id=voice_id)

    def save_voice(voice_id: str, prompt_text: str, prompt_wav: FileData) -> dict:
        """Save prompt_wav and its transcript as voice voice_id, shared by every frontend on this data
        dir. Returns {voice_id, prompt_text, created_at}."""
        with user_errors():
            return service.save_voice(voice_id, prompt_text, uploaded(service, prompt_wav))

    def list_voices() -> list[dict]:
        """The saved voices, newest first: [{voice_id, prompt_text, created_at}]."""
        with user_errors():
            return service.list_voices()

    for fn in (zero_shot, cross_lingual, instruct, saved_voice, save_voice, list_voices):
        gr.api(fn, api_name=fn.__name__)
