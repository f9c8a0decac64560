"""Where the model comes from: a local (possibly read-only) directory, or a hub id downloaded once.

    path = resolve_model_dir("/nas/models/CosyVoice2-0.5B")       # checked, returned as is
    path = resolve_model_dir("iic/CosyVoice2-0.5B", data_dir.models_root)   # downloaded on first use

A hub id is downloaded from ModelScope (the Hugging Face hub as a fallback) into `<models_root>/<owner>/
<name>`. Several frontends on one NAS starting together download it once: the download runs under a
file lock beside the target, into a hidden `.<name>.partial` dir (kept on failure, so the next try
resumes), which is renamed into place only when complete, with a `.cosy-complete` marker inside. So the
target either does not exist or is complete. Derived files never go into a model dir (it may be a
read-only mount): they go to `cache_dir()`.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import sys
import time
import zipfile
from pathlib import Path
from typing import Callable

from filelock import FileLock, Timeout

from cosy.model.families.cosyvoice3 import FAMILY as COSYVOICE3
from cosy.model.files import ALL_FILES, ModelDir, ModelDirError

DEFAULT_MODEL = "iic/CosyVoice2-0.5B"
COSYVOICE3_MODEL = "FunAudioLLM/Fun-CosyVoice3-0.5B-2512"  # the same id on ModelScope and Hugging Face
TTSFRD_MODEL = "iic/CosyVoice-ttsfrd"
HF_IDS = {DEFAULT_MODEL: "FunAudioLLM/CosyVoice2-0.5B", TTSFRD_MODEL: "FunAudioLLM/CosyVoice-ttsfrd",
          COSYVOICE3_MODEL: COSYVOICE3_MODEL}
HUB_MODELS = {"cosyvoice2": DEFAULT_MODEL, "cosyvoice3": COSYVOICE3_MODEL}  # family -> its published hub id
FAMILY_TITLES = {"cosyvoice2": "CosyVoice2", "cosyvoice3": "CosyVoice3"}
MARKER = ".cosy-complete"
TTSFRD_RESOURCE = "resource"
HUB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*")

Download = Callable[[str, Path], object]  # (model_id, local_dir) -> anything; raises on failure


def cache_dir() -> Path:
    """The writable cache for derived files: $COSY_CACHE, else ~/.cache/cosy (as cosy.lm.export), created."""
    path = Path(os.environ.get("COSY_CACHE") or Path.home() / ".cache" / "cosy").expanduser()
    path.mkdir(parents=True, exist_ok=True)
    return path


def default_models_root() -> Path:
    """Where hub downloads go without a data dir: <cache_dir()>/models."""
    return cache_dir() / "models"


def is_hub_id(spec: str) -> bool:
    """'owner/name' with safe characters (never '..', never absolute or ~): usable as two path parts."""
    return bool(HUB_ID.fullmatch(spec)) and ".." not in spec


def _say(progress: bool, msg: str) -> None:
    if progress:  # start-up messages for the operator; logging may not be configured yet
        print(f"[cosy] {msg}", file=sys.stderr, flush=True)


def _how_to_point(model_id: str) -> str:
    if model_id == TTSFRD_MODEL:
        return ("download it elsewhere (`modelscope download --model iic/CosyVoice-ttsfrd --local_dir DIR`), "
                "copy it here and pass --ttsfrd_dir /path/to/CosyVoice-ttsfrd (it must contain resource/ or "
                "resource.zip), or leave --ttsfrd_dir out to use wetext")
    if model_id == COSYVOICE3_MODEL:
        files = ", ".join(COSYVOICE3.files.all)
        return (f"download it elsewhere (`modelscope download --model {COSYVOICE3_MODEL} --local_dir DIR`), copy it "
                f"here and pass --model_dir /path/to/Fun-CosyVoice3-0.5B-2512 (it must contain {files})")
    return ("download it elsewhere (`modelscope download --model iic/CosyVoice2-0.5B --local_dir DIR`), copy it "
            f"here and pass --model_dir /path/to/CosyVoice2-0.5B (it must contain {', '.join(ALL_FILES)})")


def hub_download(model_id: str, local_dir: Path, progress: bool = True) -> str:
    """The real download: ModelScope first, then the Hugging Face hub; returns the source's name."""
    errors = []
    try:
        from modelscope import snapshot_download as ms_download  # lazy: only downloads need it
        _say(progress, f"downloading {model_id} from ModelScope into {local_dir}")
        ms_download(model_id, local_dir=str(local_dir))  # shows its own tqdm bars
        return "modelscope"
    except Exception as e:  # noqa: BLE001 (any failure: fall back, report both)
        errors.append(f"ModelScope: {type(e).__name__}: {str(e)[:300]}")
    hf_id = HF_IDS.get(model_id, model_id)
    try:
        from huggingface_hub import snapshot_download as hf_download
        from tqdm.auto import tqdm

        class _Quiet(tqdm):
            def __init__(self, *args, **kwargs):
                super().__init__(*args, **{**kwargs, "disable": True})

        _say(progress, f"downloading {hf_id} from the Hugging Face hub into {local_dir}")
        hf_download(repo_id=hf_id, local_dir=str(local_dir), **({} if progress else {"tqdm_class": _Quiet}))
        return "huggingface"
    except Exception as e:  # noqa: BLE001
        errors.append(f"Hugging Face hub ({hf_id}): {type(e).__name__}: {str(e)[:300]}")
    raise ModelDirError(f"could not download {model_id} (offline?); {'; '.join(errors)}. "
                        f"To use a local copy instead, {_how_to_point(model_id)}")


def _checked(target: Path, missing: list[str], model_id: str) -> Path:
    """`target` if nothing is missing, else an error naming the missing files and what to do."""
    if not missing:
        return target
    ours = (target / MARKER).exists()
    why = ("was downloaded completely but has lost files since; delete the directory to download it again"
           if ours else "is not a complete download (not written by cosy); complete or delete it")
    raise ModelDirError(f"{target} is missing {', '.join(missing)}: it {why}, or {_how_to_point(model_id)}")


def fetch(model_id: str, models_root: Path | None, missing: Callable[[Path], list[str]],
          download: Download | None = None, progress: bool = True,
          finish: Callable[[Path], None] | None = None) -> Path:
    """`<models_root>/<model_id>`, downloaded once across processes and machines sharing models_root.

    `missing(dir)` names the required files absent from dir; `finish(partial)` post-processes a finished
    download before it is published (e.g. unzip)."""
    if not is_hub_id(model_id):
        raise ModelDirError(f"{model_id!r} is neither an existing directory nor a hub id like {DEFAULT_MODEL}")
    root = Path(models_root).expanduser() if models_root is not None else default_models_root()
    target = root / model_id
    if target.exists():  # fast path, no lock: works on a read-only models root
        return _checked(target, missing(target), model_id)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        lock = FileLock(str(target) + ".lock")
        try:
            lock.acquire(timeout=0)
        except Timeout:
            _say(progress, f"waiting for another process downloading {model_id} into {target}")
            lock.acquire()
    except OSError as e:
        raise ModelDirError(f"cannot download {model_id} into {root} ({type(e).__name__}: {e}); use a writable "
                            f"models root, or {_how_to_point(model_id)}") from None
    try:
        if target.exists():  # another process finished it while we waited
            return _checked(target, missing(target), model_id)
        partial = target.with_name(f".{target.name}.partial")
        partial.mkdir(exist_ok=True)  # a previous try's files stay: the hub clients resume them
        try:
            source = download(model_id, partial) if download is not None else hub_download(model_id, partial, progress)
        except ModelDirError:
            raise
        except Exception as e:  # noqa: BLE001 (an injected downloader's failure, reported the same way)
            raise ModelDirError(f"could not download {model_id} ({type(e).__name__}: {e}); "
                                f"{_how_to_point(model_id)}") from e
        if finish is not None:
            finish(partial)
        if lost := missing(partial):
            raise ModelDirError(f"the download of {model_id} lacks {', '.join(lost)}: not a usable model; "
                                f"{_how_to_point(model_id)}")
        (partial / MARKER).write_text(json.dumps({"model_id": model_id, "source": str(source or "custom"),
                                                  "completed_at": time.time()}), encoding="utf-8")
        os.rename(partial, target)  # the one atomic step that makes it visible
        _say(progress, f"{model_id} is ready in {target}")
        return target
    finally:
        lock.release()


def resolve_model_dir(spec: str, models_root: Path | None = None, download: Download | None = None,
                      progress: bool = True) -> Path:
    """A complete CosyVoice2 model dir from a local path or a hub id (downloaded once, see module doc).

    Raises ModelDirError naming what is missing and how to point at a local directory."""
    local = Path(spec).expanduser()
    if local.exists() or not is_hub_id(spec):
        if not local.exists():
            raise ModelDirError(f"{spec}: no such model directory; pass a complete CosyVoice2 directory or a "
                                f"hub id such as {DEFAULT_MODEL} (downloaded on first use)")
        md = ModelDir(local)
        if lost := md.missing():
            try:
                name = md.family.name
            except ModelDirError:
                name = "cosyvoice2"
            hub, title = HUB_MODELS.get(name, DEFAULT_MODEL), FAMILY_TITLES.get(name, name)
            raise ModelDirError(f"{local} is not a complete {title} model directory: missing "
                                f"{', '.join(lost)}. Copy the complete {hub} directory there, or pass "
                                f"--model_dir {hub} to download it")
        return local
    return fetch(spec, models_root, lambda p: ModelDir(p).missing(), download, progress)


def _ttsfrd_missing(path: Path) -> list[str]:
    has = (path / TTSFRD_RESOURCE).is_dir() or (path / f"{TTSFRD_RESOURCE}.zip").is_file()
    return [] if has else [f"{TTSFRD_RESOURCE}/ (or {TTSFRD_RESOURCE}.zip)"]


def _unzip_resource(into: Path, zip_path: Path) -> None:
    """Extract resource.zip into `into`/resource via a temp dir and a rename (zipfile drops '..' parts)."""
    tmp = into / f".{TTSFRD_RESOURCE}.unzip"
    shutil.rmtree(tmp, ignore_errors=True)
    with zipfile.ZipFile(zip_path) as z:
        z.extractall(tmp)
    inner = tmp / TTSFRD_RESOURCE if (tmp / TTSFRD_RESOURCE).is_dir() else tmp  # zip holds resource/...
    os.rename(inner, into / TTSFRD_RESOURCE)
    shutil.rmtree(tmp, ignore_errors=True)


def _unzipped_in_cache(zip_path: Path) -> Path:
    """A cache dir holding resource/ from a (read-only) dir that only has resource.zip; done once."""
    st = zip_path.stat()
    key = hashlib.sha256(f"{zip_path.resolve()}|{st.st_size}|{st.st_mtime_ns}".encode()).hexdigest()[:16]
    out = cache_dir() / "ttsfrd" / key
    out.mkdir(parents=True, exist_ok=True)
    with FileLock(str(out) + ".lock"):
        if not (out / TTSFRD_RESOURCE).is_dir():
            _unzip_resource(out, zip_path)
    return out


def resolve_ttsfrd_dir(spec: str | None, models_root: Path | None = None, download: Download | None = None,
                       progress: bool = True) -> Path | None:
    """The CosyVoice-ttsfrd dir with `resource/` unpacked (what cosy.text's ttsfrd wants), or None.

    A local dir with only resource.zip is unpacked into the cache (it may be read-only); a download is
    unpacked before it is published."""
    if not spec:
        return None
    local = Path(spec).expanduser()
    if local.exists() or not is_hub_id(spec):
        if not local.is_dir():
            raise ModelDirError(f"{spec}: no such ttsfrd directory; {_how_to_point(TTSFRD_MODEL)}")
        if lost := _ttsfrd_missing(local):
            raise ModelDirError(f"{local} is missing {lost[0]}; {_how_to_point(TTSFRD_MODEL)}")
        path = local
    else:
        def finish(partial: Path) -> None:
            if not (partial / TTSFRD_RESOURCE).is_dir() and (partial / f"{TTSFRD_RESOURCE}.zip").is_file():
                _unzip_resource(partial, partial / f"{TTSFRD_RESOURCE}.zip")

        path = fetch(spec, models_root, _ttsfrd_missing, download, progress, finish)
    # a dir holding only resource.zip (copied by hand, maybe read-only) is unpacked into the cache
    return path if (path / TTSFRD_RESOURCE).is_dir() else _unzipped_in_cache(path / f"{TTSFRD_RESOURCE}.zip")
