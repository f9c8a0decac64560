"""Export llm.pt as a directory vLLM can serve: the speech-token LM as a plain causal LM over 6564 ids.

    fp = llm_fingerprint("path/to/CosyVoice2-0.5B")        # sha256 of llm.pt (cached by path, size, times)
    path = export_for_vllm("path/to/CosyVoice2-0.5B")      # ~/.cache/cosy/vllm/cosyvoice2-<sha256>/
    name = served_model_name(fp)                           # what the backend serves it as

The exported LM: embed_tokens = speech_embedding (decode steps feed speech tokens), lm_head = llm_decoder
(with bias, hence the `CosyVoice2ForCausalLM` architecture of `cosy.vllm_plugin`); text, sos and task_id
reach it only as prompt embeddings, so the text embedding table and `llm_embedding` are not exported.
The export lives in a writable cache (the model dir may be a read-only mount) under a name keyed by the
content hash of llm.pt, so a fine-tuned llm.pt never serves stale weights. Concurrent exporters are
serialised by file locks and every file is written under a temporary name and renamed into place.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

from filelock import FileLock
from safetensors.torch import save_file

from cosy.model.files import LLM, QWEN_DIR, ModelDir, ModelDirError

ARCHITECTURE = "CosyVoice2ForCausalLM"
WEIGHTS = "model.safetensors"
BACKBONE_PREFIX = "llm.model.model."  # llm.pt keys of the Qwen2 layers and final norm
_HASH_CHUNK = 8 << 20


def default_cache_dir() -> Path:
    """$COSY_CACHE, else ~/.cache/cosy."""
    return Path(os.environ.get("COSY_CACHE") or Path.home() / ".cache" / "cosy").expanduser()


def served_model_name(fingerprint: str) -> str:
    """The model name a backend serves llm.pt under; frontends compare it with GET /v1/models."""
    return "cosyvoice2-" + fingerprint[:16]


def _write_atomic(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.chmod(tmp, 0o644)  # mkstemp makes it 0600; a shared cache is read by other users
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_HASH_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def llm_fingerprint(model_dir: str | Path, cache_dir: str | Path | None = None) -> str:
    """sha256 hex of llm.pt's content, remembered in a sidecar keyed by (path, size, mtime_ns, ctime_ns,
    inode): hashing 2 GB on every start is wasteful. ctime and inode catch a same-size file rewritten with
    its old mtime restored (`cp -p`, `rsync -a`), which size + mtime alone would miss."""
    llm = ModelDir(model_dir).file(LLM).resolve()
    st = llm.stat()
    key = {"path": str(llm), "size": st.st_size, "mtime_ns": st.st_mtime_ns, "ctime_ns": st.st_ctime_ns,
           "inode": st.st_ino}
    side_dir = Path(cache_dir or default_cache_dir()) / "fingerprints"
    side_dir.mkdir(parents=True, exist_ok=True)
    sidecar = side_dir / (hashlib.sha256(str(llm).encode()).hexdigest()[:32] + ".json")

    def cached() -> str | None:
        try:
            data = json.loads(sidecar.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        return data.get("sha256") if {k: data.get(k) for k in key} == key else None

    if (fp := cached()) is not None:
        return fp
    with FileLock(str(sidecar) + ".lock"):  # one hasher per file; the others wait and reuse its result
        if (fp := cached()) is not None:
            return fp
        fp = _sha256(llm)
        _write_atomic(sidecar, json.dumps({**key, "sha256": fp}))
        return fp


def vllm_config(model_dir: ModelDir) -> dict:
    """The Qwen2 config of `CosyVoice-BlankEN/config.json` turned into the 6564-id speech LM's config."""
    path = model_dir.file(QWEN_DIR) / "config.json"
    try:
        cfg = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ModelDirError(f"{path} is not a readable JSON file ({type(e).__name__}: {e})") from None
    cfg.update(architectures=[ARCHITECTURE], model_type="qwen2", tie_word_embeddings=False,
               vocab_size=model_dir.config.speech_token_size + 3)  # speech tokens + eos, 6562, fill
    return cfg


def _weights(model_dir: ModelDir) -> dict:
    sd = model_dir.state_dict(LLM)
    try:
        out = {"model.embed_tokens.weight": sd["speech_embedding.weight"],
               "lm_head.weight": sd["llm_decoder.weight"], "lm_head.bias": sd["llm_decoder.bias"]}
    except KeyError as e:
        raise ModelDirError(f"{model_dir.file(LLM)} has no {e.args[0]}: not a CosyVoice2 llm.pt") from None
    for key, value in sd.items():
        if key.startswith(BACKBONE_PREFIX) and not key.startswith(BACKBONE_PREFIX + "embed_tokens."):
            out["model." + key[len(BACKBONE_PREFIX):]] = value
    # safetensors wants contiguous tensors; each llm.pt tensor has its own storage, so no copies otherwise
    return {k: v.contiguous() for k, v in out.items()}


def export_for_vllm(model_dir: str | Path, cache_dir: str | Path | None = None) -> Path:
    """The vLLM-servable directory of llm.pt (config.json + model.safetensors), exported on first use.

    Reused while its llm.pt hash and config match; exported under a temporary name and renamed into place
    under a lock, so concurrent callers never see (or write) a partial directory.
    """
    md = ModelDir(model_dir)
    cache = Path(cache_dir or default_cache_dir())
    fp = llm_fingerprint(md.path, cache)
    config_text = json.dumps(vllm_config(md), indent=2, sort_keys=True) + "\n"
    root = cache / "vllm"
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"cosyvoice2-{fp}"

    def current() -> bool:
        try:
            return (final / "config.json").read_text(encoding="utf-8") == config_text and (final / WEIGHTS).is_file()
        except OSError:
            return False

    if current():
        return final
    with FileLock(str(final) + ".lock"):
        if current():
            return final
        tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=root))
        try:
            os.chmod(tmp, 0o755)  # mkdtemp makes it 0700; a shared cache is read by other users
            save_file(_weights(md), str(tmp / WEIGHTS), metadata={"format": "pt", "llm_sha256": fp})
            (tmp / "config.json").write_text(config_text, encoding="utf-8")
            if final.exists():  # an export with an older config: swap it out
                trash = root / f".{final.name}.old{os.getpid()}"
                os.replace(final, trash)
                shutil.rmtree(trash, ignore_errors=True)
            os.replace(tmp, final)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return final


__all__ = ["default_cache_dir", "export_for_vllm", "llm_fingerprint", "served_model_name", "vllm_config"]
