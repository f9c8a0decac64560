"""Saved voices: a voice prompt's features computed once and stored, so later requests skip the ONNX models.

Layout under the store's directory: `<voice_id>/features.safetensors` (speech tokens, mel, embedding) and
`<voice_id>/voice.json` (prompt text, creation time, model family, for listing; the features file carries
them too, so one file read gives a consistent voice). Features belong to the family whose model computed them
(its speech tokenizer and flow), so a voice records its family and loading it for another family is an error;
voices saved before the field existed are CosyVoice2's. A voice directory is written under a temporary name, synced and
renamed into place, so readers (other frontends on the same NAS) never see a partial voice.
"""
from __future__ import annotations

import json
import math
import os
import re
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from filelock import FileLock
from safetensors import SafetensorError, safe_open
from safetensors.torch import save

from cosy.errors import BadRequest, Conflict, NotFound, echo, storing
from cosy.prompt.encoder import PromptFeatures

VOICE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
LEGACY_FAMILY = "cosyvoice2"  # the family of voices saved without one (before CosyVoice3 was served)


class VoiceError(BadRequest):
    """A bad voice id or a damaged voice (400); see UnknownVoice, VoiceExists."""


class UnknownVoice(VoiceError, NotFound):
    """No saved voice of that id (404)."""


class VoiceExists(VoiceError, Conflict):
    """A voice of that id exists already and overwriting was not asked for (409)."""


@dataclass
class Voice:
    voice_id: str
    prompt_text: str
    features: PromptFeatures
    created_at: float
    family: str = LEGACY_FAMILY  # the model family (`ModelFamily.name`) that computed `features`


def check_voice_id(voice_id: str) -> str:
    """Voice ids are 1-64 of [A-Za-z0-9_.-], not starting with '.', '_' or '-': safe as a file name."""
    if not isinstance(voice_id, str) or not VOICE_ID.fullmatch(voice_id) or ".." in voice_id:
        raise VoiceError(f"invalid voice id {echo(voice_id)}: use 1-64 letters, digits, '_', '-' or '.', "
                         "starting with a letter or digit")
    return voice_id


class VoiceStore:
    """Voices in one directory, safe to share between processes and machines (NAS)."""

    def __init__(self, root: str | Path):
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self._lock = FileLock(str(self.root / ".lock"))

    def _dir(self, voice_id: str) -> Path:
        return self.root / check_voice_id(voice_id)

    def save(self, voice_id: str, prompt_text: str, features: PromptFeatures, overwrite: bool = False,
             family: str = LEGACY_FAMILY) -> Voice:
        """Store a voice atomically (`family`: the name of the model family that computed `features`).
        Raises VoiceError if it exists and `overwrite` is False."""
        final = self._dir(voice_id)
        voice = Voice(voice_id, prompt_text, features, time.time(), family)
        with storing(f"voice '{voice_id}'"):
            return self._save(final, voice, overwrite)

    def _save(self, final: Path, voice: Voice, overwrite: bool) -> Voice:
        voice_id, prompt_text, features, family = voice.voice_id, voice.prompt_text, voice.features, voice.family
        tmp = Path(tempfile.mkdtemp(prefix=f".{voice_id}.", dir=self.root))
        try:
            meta = {"voice_id": voice_id, "prompt_text": prompt_text, "created_at": voice.created_at,
                    "family": family}
            # serialized here, written by Python's I/O: a full disk is an OSError (ENOSPC), not a Rust error
            (tmp / "features.safetensors").write_bytes(save(
                {"speech_tokens": features.speech_tokens.contiguous(), "mel": features.mel.contiguous(),
                 "embedding": features.embedding.contiguous()}, metadata={k: str(v) for k, v in meta.items()}))
            (tmp / "voice.json").write_text(json.dumps(meta, ensure_ascii=False), encoding="utf-8")
            for f in tmp.iterdir():  # on disk before the rename publishes them; readable by other users
                with open(f, "rb+") as fh:
                    os.fsync(fh.fileno())
                f.chmod(0o644)
            tmp.chmod(0o755)
            with self._lock:
                if final.exists():
                    if not overwrite:
                        raise VoiceExists(f"voice '{voice_id}' exists already")
                    trash = final.with_name(f".{voice_id}.old{os.getpid()}")
                    os.replace(final, trash)
                    os.replace(tmp, final)
                    shutil.rmtree(trash, ignore_errors=True)
                else:
                    os.replace(tmp, final)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return voice

    def load(self, voice_id: str, family: str | None = None) -> Voice:
        """The voice; with `family`, VoiceError unless it was saved by a model of that family."""
        d = self._dir(voice_id)
        try:
            voice = self._read(voice_id, d)
        except FileNotFoundError:
            with self._lock:  # maybe an overwrite was swapping directories just now
                try:
                    voice = self._read(voice_id, d)
                except FileNotFoundError:
                    raise UnknownVoice(f"unknown voice '{voice_id}'") from None
        if family is not None and voice.family != family:
            raise VoiceError(f"voice '{voice_id}' was saved with a {voice.family} model and this model is {family}: "
                             "its speech tokens and speaker features belong to the other model; save the voice "
                             "again with this model (under another id)")
        return voice

    @staticmethod
    def _read(voice_id: str, d: Path) -> Voice:
        try:
            with safe_open(str(d / "features.safetensors"), framework="pt") as f:
                meta = f.metadata() or {}
                t = {k: f.get_tensor(k) for k in ("speech_tokens", "mel", "embedding")}
            return Voice(voice_id, meta["prompt_text"], PromptFeatures(t["speech_tokens"], t["mel"], t["embedding"]),
                         float(meta["created_at"]), meta.get("family", LEGACY_FAMILY))
        except (SafetensorError, KeyError, ValueError, OSError) as e:
            if isinstance(e, FileNotFoundError):
                raise
            raise VoiceError(f"saved voice '{voice_id}' is damaged ({type(e).__name__}); save it again") from None

    def list(self) -> list[dict]:
        """[{voice_id, prompt_text, created_at, family}] of every complete voice, newest first (a directory whose
        voice.json is damaged, or not a voice's, is left out: `listing` says why)."""
        out = []
        for d in self.root.iterdir():
            if d.name.startswith(".") or not (d / "voice.json").is_file():
                continue
            try:
                out.append(self.listing(d.name))
            except VoiceError:
                continue  # damaged, or removed or replaced while we listed
        return sorted(out, key=lambda v: v["created_at"], reverse=True)

    def listing(self, voice_id: str) -> dict:
        """The voice's voice.json as listed: {voice_id, prompt_text, created_at, family}. UnknownVoice when
        there is none; VoiceError when it is damaged (not JSON, nested past the parser, not an object, or
        without a voice's fields), as the shared data dir can hold anything."""
        try:
            text = (self._dir(voice_id) / "voice.json").read_text(encoding="utf-8")
        except FileNotFoundError:
            raise UnknownVoice(f"unknown voice '{voice_id}'") from None
        except (OSError, ValueError) as e:
            raise VoiceError(f"saved voice '{voice_id}' is damaged ({type(e).__name__}); save it again") from None
        try:
            meta = json.loads(text)
        except (ValueError, RecursionError):
            meta = None
        if not (isinstance(meta, dict) and isinstance(meta.get("prompt_text"), str)
                and isinstance(meta.get("created_at"), (int, float)) and not isinstance(meta["created_at"], bool)
                and math.isfinite(meta["created_at"])
                and isinstance(meta.get("family", LEGACY_FAMILY), str)):
            raise VoiceError(f"saved voice '{voice_id}' is damaged (its voice.json is not a voice's); save it again")
        return {**meta, "voice_id": voice_id, "family": meta.get("family", LEGACY_FAMILY)}

    def delete(self, voice_id: str) -> None:
        d = self._dir(voice_id)
        with self._lock:
            if not d.exists():
                raise UnknownVoice(f"unknown voice '{voice_id}'")
            trash = d.with_name(f".{voice_id}.del{os.getpid()}")
            os.replace(d, trash)
        shutil.rmtree(trash, ignore_errors=True)
