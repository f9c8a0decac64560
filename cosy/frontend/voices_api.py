"""`/v1/audio/voices`: saved voices managed over the OpenAI-style API, in vLLM-Omni's shapes (docs/api/voices.md).

    GET    /v1/audio/voices            {"voices": [names], "uploaded_voices": [voice objects]}
    POST   /v1/audio/voices            multipart: audio_sample (file), name, consent, ref_text, [preprocess=
                                       true|false, too_long=refuse|trim] -> {"success": true, "voice": {...}}
    GET    /v1/audio/voices/{name}     the voice object
    PATCH  /v1/audio/voices/{name}     multipart, any of: name (a new name), ref_text, audio_sample (then ref_text
                                       too), consent, preprocess, too_long -> {"success": true, "voice": {...}}
    DELETE /v1/audio/voices/{name}     {"success": true, "name": name}

The store is the data dir's (`cosy.deploy.voices`), the one behind every surface: a voice made here is a
reference audio of the PAI routes, a saved voice of gradio's /saved_voice and the WebSockets, of the CLI and of
batch synthesis, and the other way round. A voice object: name, ref_text, family (the model family that
encoded it: only frontends of that family can speak with it, others answer 409), created_at, updated_at,
created_by (`key_label`), consent, prompt_seconds, preprocess (what hygiene did, or null), file_size (bytes on
disk). Prompt hygiene (`cosy.prompt.hygiene`) runs on every new audio unless `preprocess=false`, which stores the
decoded upload as the PAI route stores it.
"""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

from fastapi import APIRouter, Request
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import FormData, UploadFile

from cosy.audio.io import MAX_PROMPT_SECONDS
from cosy.deploy.data_dir import upload_extension
from cosy.deploy.voices import VoiceError, VoiceExists, check_voice_id
from cosy.errors import BadRequest, CosyError, PayloadTooLarge, echo
from cosy.frontend.api_routing import add_route, api_router
from cosy.frontend.encoding import wav_bytes
from cosy.frontend.pai_api import MULTIPART_SLACK
from cosy.frontend.reference_audio import decode_upload
from cosy.frontend.service import FrontendService
from cosy.pipeline.request import clean_filename
from cosy.prompt.hygiene import TOO_LONG, Hygiene, clean

MAX_CONSENT_CHARS = 200
TRIM_DECODE_LIMIT = 2 * MAX_PROMPT_SECONDS  # seconds decoded of an upload that hygiene may cut (too_long=trim)
OPEN_LABEL, KEY_LABEL = "anonymous", "api_key"


def key_label(keyed: bool) -> str:
    """Who created a voice, as recorded: the label of the credential the request was let in with, never the key.
    A frontend has one key (--api_key), labelled "api_key"; without a key, "anonymous"."""
    return KEY_LABEL if keyed else OPEN_LABEL


def check_name(value: object, field: str = "name") -> str:
    """A voice name by the voice-id rule (`check_voice_id`), the error naming the field."""
    if not isinstance(value, str) or not value:
        raise BadRequest(f"'{field}' is required: the voice's name (1-64 letters, digits, '_', '-' or '.')")
    try:
        return check_voice_id(value)
    except VoiceError:
        raise BadRequest(f"'{field}' {echo(value)} is not a valid voice name: use 1-64 letters, digits, '_', '-' or "
                         "'.', starting with a letter or digit") from None


def _text(form: FormData, field: str) -> str | None:
    value = form.get(field)
    if value is not None and not isinstance(value, str):
        raise BadRequest(f"'{field}' must be a form field, not a file")
    return value


def _flag(form: FormData, field: str, default: bool) -> bool:
    value = _text(form, field)
    if value is None or value == "":
        return default
    if value.lower() in ("true", "1", "yes", "on"):
        return True
    if value.lower() in ("false", "0", "no", "off"):
        return False
    raise BadRequest(f"'{field}' must be true or false, got {echo(value)}")


def voice_object(listed: dict, size: int) -> dict:
    """A store listing -> the API's voice object."""
    return {"name": listed["voice_id"], "object": "voice", "ref_text": listed["prompt_text"],
            "family": listed["family"], "created_at": int(listed["created_at"]),
            "updated_at": int(listed["updated_at"]), "created_by": listed.get("created_by"),
            "consent": listed.get("consent"), "prompt_seconds": listed.get("prompt_seconds"),
            "preprocess": listed.get("preprocess"), "file_size": size}


class Enrollment:
    """An uploaded prompt made ready to store: checked, decoded, cleaned (hygiene), written to a temp wav."""

    def __init__(self, service: FrontendService, data: bytes, filename: str, preprocess: bool, too_long: str):
        if too_long not in TOO_LONG:
            raise BadRequest(f"'too_long' must be one of {', '.join(TOO_LONG)}, got {echo(too_long)}")
        service.data.check_upload(len(data))
        ext = upload_extension(clean_filename(filename))
        limit = TRIM_DECODE_LIMIT if preprocess and too_long == "trim" else MAX_PROMPT_SECONDS
        audio, rate = decode_upload(data, ext, limit=limit)
        self.report = None
        if preprocess:
            audio, self.report = clean(audio, rate, Hygiene(too_long=too_long))
        fd, self.path = tempfile.mkstemp(suffix=".wav")  # outside the data dir: nothing there until it is a voice
        with os.fdopen(fd, "wb") as f:
            f.write(wav_bytes(audio, rate))

    def close(self) -> None:
        Path(self.path).unlink(missing_ok=True)

    def errors_of(self, e: CosyError) -> CosyError:
        """A worker's error about our temp file, in the words of the upload."""
        return CosyError(str(e).replace(f"prompt audio file '{self.path}'", "the audio_sample"), e.status,
                         e.retry_after)


def build_voices_router(service: FrontendService, dependencies: list) -> APIRouter:
    router = api_router(dependencies=dependencies, tags=["OpenAI-compatible"])
    store = service.data.voices
    created_by = key_label(bool(dependencies))

    def get_object(name: str) -> dict:
        return voice_object(store.listing(name), store.size(name))

    async def read_form(request: Request) -> FormData:
        length = request.headers.get("content-length", "")
        if length.isdigit() and int(length) > MULTIPART_SLACK:  # a far too large body: refused before it is read
            service.data.check_upload(int(length) - MULTIPART_SLACK)
        return await request.form(max_files=1, max_fields=10)

    async def read_audio(form: FormData, required: bool) -> tuple[bytes, str] | None:
        file = form.get("audio_sample")
        if file is None or file == "":
            if required:
                raise BadRequest("'audio_sample' is required: the voice's reference audio (wav, mp3, flac, ogg, "
                                 "opus, aac, m4a or webm, 3-30 s) as a multipart file")
            return None
        if not isinstance(file, UploadFile):
            raise BadRequest("'audio_sample' must be a file (multipart/form-data), not a text field")
        limit = service.data.max_upload_bytes
        data = await file.read(limit + 1)
        if len(data) > limit:  # a chunked body has no length to refuse it by up front
            raise PayloadTooLarge(f"'audio_sample' is larger than the limit of {limit / 2**20:.0f} MB (a voice prompt "
                                  "needs only 3-30 s of audio)")
        return data, file.filename or ""

    def consent_of(form: FormData, required: bool) -> str | None:
        consent = _text(form, "consent")
        if consent is None or not consent.strip():
            if required:
                raise BadRequest("'consent' is required: an identifier of the speaker's consent to this voice "
                                 "(e.g. a consent recording's id)")
            return None
        if len(consent) > MAX_CONSENT_CHARS:
            raise BadRequest(f"'consent' is {len(consent)} characters; at most {MAX_CONSENT_CHARS}")
        return consent.strip()

    def enroll(audio: tuple[bytes, str], preprocess: bool, too_long: str) -> Enrollment:
        return Enrollment(service, audio[0], audio[1], preprocess, too_long)

    async def list_voices():
        """The saved voices, newest first (every family's: `family` says which model can speak with each)."""
        def listing() -> dict:
            voices = []
            for v in service.list_voices():
                try:
                    voices.append(voice_object(v, store.size(v["voice_id"])))
                except VoiceError:
                    continue  # removed while we listed
            return {"object": "list", "voices": [v["name"] for v in voices], "uploaded_voices": voices}
        return await run_in_threadpool(listing)

    async def create_voice(request: Request):
        """Create a voice from a multipart upload: audio_sample, name, consent, ref_text (its transcript)."""
        form = await read_form(request)
        try:
            name = check_name(_text(form, "name"))
            consent = consent_of(form, required=True)
            ref_text = _text(form, "ref_text")
            if ref_text is None or not ref_text.strip():
                raise BadRequest("'ref_text' is required: the transcript of audio_sample")
            service.check_transcript(ref_text, "'ref_text'")
            preprocess, too_long = _flag(form, "preprocess", True), _text(form, "too_long") or "refuse"
            audio = await read_audio(form, required=True)
        finally:
            await form.close()

        def create() -> dict:
            if store.exists(name):  # before any work; the store checks again when it writes
                raise VoiceExists(f"a voice named {echo(name)} exists already: choose another name, or PATCH or "
                                  "DELETE /v1/audio/voices/{name}")
            prompt = enroll(audio, preprocess, too_long)
            try:
                meta = {"created_by": created_by, "consent": consent, "preprocess": prompt.report}
                try:
                    service.save_voice(name, ref_text, prompt.path, meta=meta)
                except CosyError as e:
                    raise prompt.errors_of(e) from None
            finally:
                prompt.close()
            return {"success": True, "voice": get_object(name)}
        return await run_in_threadpool(create)

    async def get_voice(name: str):
        check_name(name)
        return await run_in_threadpool(get_object, name)

    async def update_voice(name: str, request: Request):
        """Rename (`name`), new transcript (`ref_text`), new audio (`audio_sample` with its `ref_text`), consent."""
        check_name(name)
        form = await read_form(request)
        try:
            new_name = _text(form, "name")
            new_name = check_name(new_name) if new_name else None
            consent = consent_of(form, required=False)
            ref_text = _text(form, "ref_text")
            ref_text = ref_text if ref_text and ref_text.strip() else None
            audio = await read_audio(form, required=False)
            if audio is not None and ref_text is None:
                raise BadRequest("'ref_text' is required with a new audio_sample: its transcript")
            if ref_text is not None:
                service.check_transcript(ref_text, "'ref_text'")
            preprocess, too_long = _flag(form, "preprocess", True), _text(form, "too_long") or "refuse"
        finally:
            await form.close()
        if new_name is None and consent is None and ref_text is None and audio is None:
            raise BadRequest("nothing to update: send any of 'name' (a new name), 'ref_text', 'audio_sample' (with "
                             "'ref_text'), 'consent'")

        def update() -> dict:
            store.listing(name)  # 404 before any work
            prompt = enroll(audio, preprocess, too_long) if audio is not None else None
            try:
                meta = {} if consent is None else {"consent": consent}
                if prompt is not None:
                    meta["preprocess"] = prompt.report
                try:
                    listed = service.update_voice(name, new_id=new_name, prompt_text=ref_text,
                                                  prompt_wav=prompt.path if prompt else None, meta=meta)
                except CosyError as e:
                    raise prompt.errors_of(e) if prompt else e from None
            finally:
                if prompt is not None:
                    prompt.close()
            return {"success": True, "voice": get_object(listed["voice_id"])}
        return await run_in_threadpool(update)

    async def delete_voice(name: str):
        check_name(name)
        await run_in_threadpool(service.delete_voice, name)
        return {"success": True, "name": name}

    add_route(router, "GET", "/v1/audio/voices", list_voices, summary="List voices")
    add_route(router, "POST", "/v1/audio/voices", create_voice, summary="Create a voice (multipart upload)")
    add_route(router, "GET", "/v1/audio/voices/{name}", get_voice, summary="Get a voice")
    add_route(router, "PATCH", "/v1/audio/voices/{name}", update_voice, summary="Rename or update a voice")
    add_route(router, "DELETE", "/v1/audio/voices/{name}", delete_voice, summary="Delete a voice")
    return router
