"""`--data_dir`: uploads, saved voices and model dirs, shared safely by several frontends (e.g. on a NAS).

    data = DataDir("/nas/cosy")
    path = data.save_upload(wav_bytes, "prompt.wav")   # uploads/<sha256>.wav, written atomically
    data.voices.save("alice", text, features)          # voices/alice/ (cosy.deploy.voices.VoiceStore)
    data.lexicon.entries()                             # lexicon.tsv (cosy.deploy.lexicon.LexiconStore)
    model = resolve_model_dir(spec, data.models_root)  # models/<owner>/<name> (cosy.deploy.models)
    data.fine_tuned("my-voice-ft")                     # models/my-voice-ft, checked complete

Every file appears under its final name only when complete (written under a hidden temporary name in
the same directory, then renamed), so another frontend never reads a partial file. Names that come from
users (upload file names, voice ids, model names) never become paths unchecked.
"""
from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path, PurePosixPath

from cosy.deploy.lexicon import FILE_NAME as LEXICON_FILE
from cosy.deploy.lexicon import LexiconStore
from cosy.deploy.voices import VOICE_ID, VoiceStore
from cosy.errors import BadRequest, PayloadTooLarge, UnsupportedMedia, echo, storing
from cosy.model.files import ModelDir, ModelDirError

UPLOAD_EXTENSIONS = frozenset({"wav", "mp3", "flac", "ogg", "opus", "aac", "m4a", "pcm", "webm"})
MAX_UPLOAD_BYTES = 20 * 1024 * 1024


def check_name(name: str, what: str = "model name") -> str:
    """Like voice ids: 1-64 of [A-Za-z0-9_.-], starting with a letter or digit, no '..'; safe as a dir name."""
    if not isinstance(name, str) or not VOICE_ID.fullmatch(name) or ".." in name:
        raise ValueError(f"invalid {what} {echo(name)}: use 1-64 letters, digits, '_', '-' or '.', "
                         "starting with a letter or digit")
    return name


def upload_extension(filename: str) -> str:
    """The lower-case extension of an uploaded file's name if it is an allowed audio type; else ValueError."""
    # only the suffix of the last component is used: '../../x.wav' and 'C:\\x.wav' give 'wav', never a path
    name = PurePosixPath(str(filename or "").replace("\\", "/")).name
    ext = name.rsplit(".", 1)[-1].lower() if "." in name else ""
    if ext not in UPLOAD_EXTENSIONS:
        raise UnsupportedMedia(f"unsupported upload {echo(name)}: the file name must end in one of "
                         f"{', '.join('.' + e for e in sorted(UPLOAD_EXTENSIONS))}")
    return ext


def write_atomic(path: Path, data: bytes) -> None:
    """Write `data` to `path` so that readers see either nothing or all of it (temp file + rename)."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())  # on a NAS, the rename must not overtake the data
        os.chmod(tmp, 0o644)  # mkstemp makes it 0600; other frontends may run as other users
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


class DataDir:
    """The layout of one data dir: voices/, uploads/, models/. Creating it concurrently is safe."""

    def __init__(self, root: str | Path, max_upload_bytes: int = MAX_UPLOAD_BYTES, upload_bounds=None):
        """upload_bounds: a `cosy.frontend.store.Bounds` (age, total size) that uploads/ is pruned to after
        every new upload; None: never pruned."""
        self.root = Path(root).expanduser()
        self.max_upload_bytes = max_upload_bytes
        self.upload_bounds = upload_bounds
        for sub in ("voices", "uploads", "models"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)  # exist_ok: 8 frontends may race here
        self._voices = VoiceStore(self.root / "voices")
        self.lexicon = LexiconStore(self.root / LEXICON_FILE)  # the shared pronunciation lexicon

    @property
    def voices(self) -> VoiceStore:
        return self._voices

    @property
    def uploads(self) -> Path:
        return self.root / "uploads"

    @property
    def models_root(self) -> Path:
        """Where hub downloads (`<owner>/<name>`) and fine-tuned model dirs (`<name>`) live."""
        return self.root / "models"

    def check_upload(self, size: int) -> None:
        """The one upload size rule: not empty, at most `max_upload_bytes` (BadRequest / PayloadTooLarge);
        `upload_extension` is the one file name rule."""
        if size == 0:
            raise BadRequest("the uploaded file is empty")
        if size > self.max_upload_bytes:
            raise PayloadTooLarge(f"the uploaded file is {size / 2**20:.1f} MB; the limit is "
                                  f"{self.max_upload_bytes / 2**20:.0f} MB (a voice prompt needs only 3-30 s of audio)")

    def save_upload(self, data: bytes, filename: str) -> Path:
        """Store an uploaded prompt under uploads/<sha256>.<ext>; the same content gives the same path.

        Raises `check_upload`'s and `upload_extension`'s errors (all ValueErrors)."""
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise BadRequest("upload data must be bytes")
        path = self.upload_path(data, filename)
        if not path.is_file():  # content-addressed: an existing file already holds exactly these bytes
            with storing("the upload"):
                write_atomic(path, bytes(data))
            if self.upload_bounds is not None:
                from cosy.frontend.store import prune
                prune(self.uploads, self.upload_bounds, keep=path)
        else:
            os.utime(path)  # in use again: the newest for the age and size bounds
        return path

    def upload_path(self, data: bytes, filename: str) -> Path:
        """Where `save_upload` stores these bytes (checked like it: size and file name)."""
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise BadRequest("upload data must be bytes")
        self.check_upload(len(data))
        return self.uploads / f"{hashlib.sha256(data).hexdigest()}.{upload_extension(filename)}"

    def fine_tuned_models(self) -> list[str]:
        """Names of the complete model dirs directly under models/ (hub downloads' owner dirs are not)."""
        out = []
        for d in sorted(self.models_root.iterdir()):
            if d.is_dir() and VOICE_ID.fullmatch(d.name) and ".." not in d.name and not ModelDir(d).missing():
                out.append(d.name)
        return out

    def fine_tuned(self, name: str) -> Path:
        """models/<name>, checked to be a complete model dir; ValueError for a bad name, ModelDirError else."""
        path = self.models_root / check_name(name)
        if not path.is_dir():
            known = ", ".join(self.fine_tuned_models()) or "none"
            raise ModelDirError(f"no fine-tuned model {name!r} in {self.models_root} (available: {known})")
        if lost := ModelDir(path).missing():
            raise ModelDirError(f"fine-tuned model {path} is incomplete: missing {', '.join(lost)}")
        return path
