"""Export llm.pt as a directory vLLM can serve: the speech-token LM as a plain causal LM over its speech ids.

    fp = llm_fingerprint("path/to/CosyVoice2-0.5B")        # sha256 of llm.pt (cached by path, size, times)
    path = export_for_vllm("path/to/CosyVoice2-0.5B")      # ~/.cache/cosy/vllm/cosyvoice2-<sha256>/
    name = served_model_name(fp, family)                   # what the backend serves it as

What is exported is the model family's (`ModelFamily.export_weights`, `.vllm_architecture`, `.tokens.vocab`).
For CosyVoice2, a Qwen2 over 6564 ids: embed_tokens = speech_embedding (decode steps feed speech tokens),
lm_head = llm_decoder (with bias, hence the `CosyVoice2ForCausalLM` architecture of `cosy.vllm_plugin`);
text, sos and task_id reach it only as prompt embeddings, so the text embedding table and `llm_embedding`
are not exported. CosyVoice3: the same over 6761 ids (sos/task_id are rows of the exported table but, like
every stop id, never fed as a decode input), head without bias (`CosyVoice3ForCausalLM`).
config.json carries `cosy_family` (the family name) for the plugin's logits processor, and `head_dtype`
float32 (vLLM's option): the logits are float32 products in a bfloat16 backend too.
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

from cosy.model.families.cosyvoice2 import FAMILY as COSYVOICE2
from cosy.model.family import ModelFamily
from cosy.model.files import ModelDir, ModelDirError

WEIGHTS = "model.safetensors"
FAMILY_KEY = "cosy_family"  # config.json key naming the model family
_HASH_CHUNK = 8 << 20


def default_cache_dir() -> Path:
    """$COSY_CACHE, else ~/.cache/cosy."""
    return Path(os.environ.get("COSY_CACHE") or Path.home() / ".cache" / "cosy").expanduser()


def served_model_name(fingerprint: str, family: ModelFamily | None = None) -> str:
    """The model name a backend serves llm.pt under; frontends compare it with GET /v1/models.

    family: the model directory's (`ModelDir(path).family`); None stands for CosyVoice2, for callers that
    predate families."""
    return (family or COSYVOICE2).served_model_name(fingerprint)


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


def llm_fingerprint(model_dir: str | Path, cache_dir: str | Path | None = None, variant: str | None = None) -> str:
    """sha256 hex of llm.pt's content, remembered in a sidecar keyed by (path, size, mtime_ns, ctime_ns,
    inode): hashing 2 GB on every start is wasteful. ctime and inode catch a same-size file rewritten with
    its old mtime restored (`cp -p`, `rsync -a`), which size + mtime alone would miss. `variant`: another
    LM checkpoint of the family (`ModelFiles.llm_variants`, e.g. CosyVoice3's "rl" = llm.rl.pt)."""
    md = ModelDir(model_dir)
    llm = md.file(md.llm_name(variant)).resolve()
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
    """The Qwen2 config of `CosyVoice-BlankEN/config.json` turned into the speech LM's config (CosyVoice2:
    6564 ids), with the family's architecture and name."""
    family = model_dir.family
    path = model_dir.file(family.files.qwen_dir) / "config.json"
    try:
        cfg = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ModelDirError(f"{path} is not a readable JSON file ({type(e).__name__}: {e})") from None
    # head_dtype: vLLM computes the logits in float32 whatever --dtype (else a bfloat16 backend's logits would
    # be bf16 values), as the embedded LM does (`SpeechLM.logits`)
    cfg.update(architectures=[family.vllm_architecture], model_type="qwen2", tie_word_embeddings=False,
               vocab_size=family.tokens.vocab, head_dtype="float32", **{FAMILY_KEY: family.name})
    return cfg


def _weights(model_dir: ModelDir, variant: str | None = None) -> dict:
    family = model_dir.family
    llm, prefix = model_dir.llm_name(variant), family.backbone_prefix
    sd = model_dir.state_dict(llm)
    try:
        out = {dst: sd[src] for dst, src in family.export_weights}
    except KeyError as e:
        raise ModelDirError(f"{model_dir.file(llm)} has no {e.args[0]}: not a {family.name} llm.pt") from None
    for key, value in sd.items():
        if key.startswith(prefix) and not key.startswith(prefix + "embed_tokens."):
            out["model." + key[len(prefix):]] = value
    # safetensors wants contiguous tensors; each llm.pt tensor has its own storage, so no copies otherwise
    return {k: v.contiguous() for k, v in out.items()}


def export_for_vllm(model_dir: str | Path, cache_dir: str | Path | None = None, variant: str | None = None) -> Path:
    """The vLLM-servable directory of llm.pt (or of the LM `variant`: llm.rl.pt for "rl"; config.json +
    model.safetensors), exported on first use.

    Reused while its llm.pt hash and config match; exported under a temporary name and renamed into place
    under a lock, so concurrent callers never see (or write) a partial directory.
    """
    md = ModelDir(model_dir)
    cache = Path(cache_dir or default_cache_dir())
    fp = llm_fingerprint(md.path, cache, variant)
    config_text = json.dumps(vllm_config(md), indent=2, sort_keys=True) + "\n"
    root = cache / "vllm"
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"{md.family.served_name_prefix}-{fp}"

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
            save_file(_weights(md, variant), str(tmp / WEIGHTS), metadata={"format": "pt", "llm_sha256": fp})
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
