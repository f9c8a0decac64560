"""Saved voices: a voice prompt's features computed once and stored, so later requests skip the ONNX models.

Layout under the store's directory: `<voice_id>/features.safetensors` (speech tokens, mel, embedding) and
`<voice_id>/voice.json` (prompt text, creation time, model family, for listing; the features file carries
them too, so one file read gives a consistent voice). Features belong to the family whose model computed them
(its speech tokenizer and flow), so a voice records its family and loading it for another family is an error;
voices saved before the field existed are CosyVoice2's. A voice directory is written under a temporary name, synced and
renamed into place, so readers (other frontends on the same NAS) never see a partial voice.

A voice is a managed resource (`docs/api/voices.md`): voice.json also records `updated_at`, and where the
saving surface knows them `created_by` (the label of the credential that made it, never a key), `consent`
and `prompt_seconds`. `update` renames a voice or replaces its transcript or features in one atomic swap
(other files in its directory, e.g. a PAI reference audio's `reference.json`, move with it). `VoiceLimits`
caps the number of voices and their total size on disk (`--max_voices`, `--voices_max_mb`): a new voice
past either is refused with `VoiceStoreFull` (409); replacing or updating one is not counted as a new one.
"""
from __future__ import annotations

import json
import math
import os
import re
import shutil
import tempfile
import time
from dataclasses import dataclass, field
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


class WrongFamily(VoiceError, Conflict):
    """The voice was saved by a model of another family: its features do not fit this model (409)."""


class VoiceStoreFull(VoiceError, Conflict):
    """A new voice would pass `VoiceLimits` (409): delete voices, or raise --max_voices / --voices_max_mb."""


# the fields of voice.json besides the voice's own (voice_id, prompt_text, created_at, family)
META_FIELDS = ("updated_at", "created_by", "consent", "prompt_seconds", "preprocess")


@dataclass(frozen=True)
class VoiceLimits:
    """Caps on one store (None: no cap): the number of voices, and their total bytes on disk."""
    max_voices: int | None = None
    max_bytes: int | None = None

    @classmethod
    def of(cls, max_voices: int, max_mb: float) -> "VoiceLimits":
        """From the flags (0: no cap)."""
        return cls(max_voices or None, int(max_mb * 2**20) or None)


DEFAULT_LIMITS = VoiceLimits.of(1000, 1024)  # --max_voices, --voices_max_mb


@dataclass
class Voice:
    voice_id: str
    prompt_text: str
    features: PromptFeatures
    created_at: float
    family: str = LEGACY_FAMILY  # the model family (`ModelFamily.name`) that computed `features`
    meta: dict = field(default_factory=dict)  # META_FIELDS, as far as the saving surface knows them


def check_voice_id(voice_id: str) -> str:
    """Voice ids are 1-64 of [A-Za-z0-9_.-], not starting with '.', '_' or '-': safe as a file name."""
    if not isinstance(voice_id, str) or not VOICE_ID.fullmatch(voice_id) or ".." in voice_id:
        raise VoiceError(f"invalid voice id {echo(voice_id)}: use 1-64 letters, digits, '_', '-' or '.', "
                         "starting with a letter or digit")
    return voice_id


class VoiceStore:
    """Voices in one directory, safe to share between processes and machines (NAS)."""

    def __init__(self, root: str | Path, limits: VoiceLimits = VoiceLimits()):
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self._lock = FileLock(str(self.root / ".lock"))
        self.limits = limits

    def _dir(self, voice_id: str) -> Path:
        return self.root / check_voice_id(voice_id)

    def save(self, voice_id: str, prompt_text: str, features: PromptFeatures, overwrite: bool = False,
             family: str = LEGACY_FAMILY, meta: dict | None = None) -> Voice:
        """Store a voice atomically (`family`: the name of the model family that computed `features`;
        `meta`: META_FIELDS the caller knows). Raises VoiceExists if it exists and `overwrite` is False,
        VoiceStoreFull past `limits`."""
        final = self._dir(voice_id)
        now = time.time()
        voice = Voice(voice_id, prompt_text, features, now, family, {**(meta or {}), "updated_at": now})
        with storing(f"voice '{voice_id}'"):
            return self._save(final, voice, overwrite)

    def update(self, voice_id: str, *, new_id: str | None = None, prompt_text: str | None = None,
               features: PromptFeatures | None = None, family: str | None = None,
               meta: dict | None = None) -> Voice:
        """Rename the voice (`new_id`) and/or replace its transcript, features (with the `family` that computed
        them) or META_FIELDS, in one atomic swap; created_at and created_by are kept. UnknownVoice,
        VoiceExists (`new_id` taken)."""
        new_id = check_voice_id(new_id or voice_id)
        old = self.load(voice_id)
        listed = self.listing(voice_id)
        kept = {k: listed[k] for k in META_FIELDS if k in listed}
        now = time.time()
        voice = Voice(new_id, old.prompt_text if prompt_text is None else prompt_text,
                      old.features if features is None else features, old.created_at,
                      old.family if family is None else family, {**kept, **(meta or {}), "updated_at": now})
        with storing(f"voice '{new_id}'"):
            return self._save(self._dir(new_id), voice, overwrite=True, replaces=self._dir(voice_id))

    def _room(self, final: Path, replaced: Path | None, size: int) -> None:
        """VoiceStoreFull if one more voice of `size` bytes (in place of `replaced`, if any) passes the limits.
        Called under the lock."""
        limits = self.limits
        if limits.max_voices is None and limits.max_bytes is None:
            return
        dirs = [d for d in self.root.iterdir() if not d.name.startswith(".") and (d / "voice.json").is_file()]
        others = [d for d in dirs if d != replaced]
        if replaced is None and limits.max_voices is not None and len(others) >= limits.max_voices:
            raise VoiceStoreFull(f"this data dir holds {len(others)} voices, the limit (--max_voices "
                                 f"{limits.max_voices}): delete a voice first (DELETE /v1/audio/voices/{{name}})")
        if limits.max_bytes is not None:
            used = sum(_bytes(d) for d in others)
            if used + size > limits.max_bytes:
                raise VoiceStoreFull(f"the voices use {used / 2**20:.1f} MB and this one needs {size / 2**20:.2f} "
                                     f"MB more; the limit is {limits.max_bytes / 2**20:g} MB (--voices_max_mb): "
                                     "delete a voice first (DELETE /v1/audio/voices/{name})")

    def _save(self, final: Path, voice: Voice, overwrite: bool, replaces: Path | None = None) -> Voice:
        """Write `voice` into `final`; `replaces`: the voice it takes the place of (`update`: the old name's
        directory, whose other files come along), else `final` itself when `overwrite`."""
        voice_id, prompt_text, features, family = voice.voice_id, voice.prompt_text, voice.features, voice.family
        tmp = Path(tempfile.mkdtemp(prefix=f".{voice_id}.", dir=self.root))
        try:
            meta = {"voice_id": voice_id, "prompt_text": prompt_text, "created_at": voice.created_at,
                    "family": family, **{k: v for k, v in voice.meta.items() if k in META_FIELDS}}
            # serialized here, written by Python's I/O: a full disk is an OSError (ENOSPC), not a Rust error
            (tmp / "features.safetensors").write_bytes(save(
                {"speech_tokens": features.speech_tokens.contiguous(), "mel": features.mel.contiguous(),
                 "embedding": features.embedding.contiguous()}, metadata={k: str(v) for k, v in meta.items()}))
            (tmp / "voice.json").write_text(json.dumps(meta, ensure_ascii=False), encoding="utf-8")
            if replaces is not None and replaces.is_dir():  # the old directory's other files move along
                for f in replaces.iterdir():
                    if f.is_file() and not (tmp / f.name).exists():
                        shutil.copyfile(f, tmp / f.name)
            for f in tmp.iterdir():  # on disk before the rename publishes them; readable by other users
                with open(f, "rb+") as fh:
                    os.fsync(fh.fileno())
                f.chmod(0o644)
            tmp.chmod(0o755)
            with self._lock:
                if replaces is not None and not replaces.exists():
                    raise UnknownVoice(f"unknown voice '{replaces.name}'")  # deleted meanwhile
                if replaces is not None and replaces != final and final.exists():
                    raise VoiceExists(f"voice '{voice_id}' exists already: choose another name, or delete it first")
                if final.exists() and not overwrite:
                    raise VoiceExists(f"voice '{voice_id}' exists already")
                old = replaces if replaces is not None else (final if final.exists() else None)
                self._room(final, old, _bytes(tmp))
                trash = None
                if old is not None:
                    trash = old.with_name(f".{old.name}.old{os.getpid()}")
                    os.replace(old, trash)
                os.replace(tmp, final)
                if trash is not None:
                    shutil.rmtree(trash, ignore_errors=True)
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
            raise WrongFamily(f"voice '{voice_id}' was saved with a {voice.family} model and this model is {family}: "
                             "its speech tokens and speaker features belong to the other model; save the voice "
                             "again with this model (under another id)")
        return voice

    @staticmethod
    def _read(voice_id: str, d: Path) -> Voice:
        try:
            with safe_open(str(d / "features.safetensors"), framework="pt") as f:
                meta = f.metadata() or {}
                t = {k: f.get_tensor(k) for k in ("speech_tokens", "mel", "embedding")}
            features = PromptFeatures(t["speech_tokens"], t["mel"], t["embedding"]).check()
            return Voice(voice_id, meta["prompt_text"], features, float(meta["created_at"]),
                         meta.get("family", LEGACY_FAMILY))
        except (SafetensorError, KeyError, ValueError, OSError) as e:
            if isinstance(e, FileNotFoundError):
                raise
            why = f"{type(e).__name__}: {e}" if type(e) is ValueError else type(e).__name__  # (ours: `check`)
            raise VoiceError(f"saved voice '{voice_id}' is damaged ({why}); save it again") from None

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
        return {**meta, "voice_id": voice_id, "family": meta.get("family", LEGACY_FAMILY),
                "updated_at": meta.get("updated_at", meta["created_at"])}

    def exists(self, voice_id: str) -> bool:
        return (self._dir(voice_id) / "voice.json").is_file()

    def size(self, voice_id: str) -> int:
        """The voice's bytes on disk (what counts against `limits.max_bytes`)."""
        return _bytes(self._dir(voice_id))

    def delete(self, voice_id: str) -> None:
        d = self._dir(voice_id)
        with self._lock:
            if not d.exists():
                raise UnknownVoice(f"unknown voice '{voice_id}'")
            trash = d.with_name(f".{voice_id}.del{os.getpid()}")
            os.replace(d, trash)
        shutil.rmtree(trash, ignore_errors=True)


def _bytes(d: Path) -> int:
    """The bytes of the files directly in `d` (a voice directory has no subdirectories)."""
    total = 0
    for f in d.iterdir() if d.is_dir() else ():
        try:
            total += f.stat().st_size
        except OSError:
            pass  # removed meanwhile
    return total
