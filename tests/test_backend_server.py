"""The backend: llm.pt export, the logits processor, and `launch/backend.py` serving the tiny model on vLLM.

The `backend` fixture (tests/conftest.py: one real vLLM server per session, ~40 s to start on the CPU) serves
client tests: `.url` (".../v1"), `.api_key`, `.port`, `.proc`, `.model_name`, `.stop()`, `.start()`.
"""
from __future__ import annotations

import base64
import collections
import hashlib
import io
import json
import os
import socket
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace

import httpx
import openai
import pytest
import torch
from conftest import PEAKED_BIAS, copy_lm_files, launched_backend
from safetensors import safe_open
from servers import BACKEND, READY, Backend, free_port

from cosy.deploy import backend as backend_launcher
from cosy.lm import SamplingParams, SpeechLM, ras_distribution
from cosy.lm import export as export_mod
from cosy.lm.export import export_for_vllm, llm_fingerprint, served_model_name
from cosy.model.families.cosyvoice2 import FAMILY as CV2
from cosy.model.files import LLM, QWEN_DIR

TOKENS = CV2.tokens
STOP_TOKENS = TOKENS.stop

ROOT = Path(__file__).resolve().parents[1]
ALPHA = 1e-3  # significance level of the sampling tests: a correct sampler fails each with probability 1e-3
TEXT, PROMPT_TEXT, PROMPT_SPEECH = [100, 200, 300, 400, 500], [7, 8], [11, 12, 13]


# ---- export --------------------------------------------------------------------------------------------

def test_export_layout(tiny_model_dir, tmp_path):
    out = export_for_vllm(tiny_model_dir, tmp_path)
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors"]
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["architectures"] == ["CosyVoice2ForCausalLM"] and cfg["model_type"] == "qwen2"
    assert cfg["vocab_size"] == 6564 and cfg["tie_word_embeddings"] is False
    sd = torch.load(tiny_model_dir / LLM, weights_only=True)
    n_layers = cfg["num_hidden_layers"]
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        keys = set(f.keys())
        expected = {"model.embed_tokens.weight", "model.norm.weight", "lm_head.weight", "lm_head.bias"}
        expected |= {"model." + k[len("llm.model.model."):] for k in sd
                     if k.startswith("llm.model.model.layers.")}
        assert keys == expected and sum(".q_proj.weight" in k for k in keys) == n_layers
        assert f.get_slice("model.embed_tokens.weight").get_shape() == [6564, cfg["hidden_size"]]
        assert f.get_slice("lm_head.bias").get_shape() == [6564]
        assert torch.equal(f.get_tensor("model.embed_tokens.weight"), sd["speech_embedding.weight"])
        assert torch.equal(f.get_tensor("lm_head.weight"), sd["llm_decoder.weight"])
        assert torch.equal(f.get_tensor("lm_head.bias"), sd["llm_decoder.bias"])
        assert torch.equal(f.get_tensor("model.layers.1.mlp.up_proj.weight"),
                           sd["llm.model.model.layers.1.mlp.up_proj.weight"])
    assert out.name == "cosyvoice2-" + hashlib.sha256((tiny_model_dir / LLM).read_bytes()).hexdigest()


def test_fingerprint_cached_and_changed_llm_gets_new_export(tiny_model_dir, tmp_path, monkeypatch):
    md = copy_lm_files(tiny_model_dir, tmp_path / "model")
    sd = torch.load(md / LLM, weights_only=True)
    torch.save(sd, md / LLM)  # re-saved so the fine-tune below comes out the same size
    cache = tmp_path / "cache"
    calls = collections.Counter()
    real = export_mod._sha256
    monkeypatch.setattr(export_mod, "_sha256", lambda p: calls.update([p]) or real(p))
    fp = llm_fingerprint(md, cache)
    assert fp == hashlib.sha256((md / LLM).read_bytes()).hexdigest() and len(calls) == 1
    first = export_for_vllm(md, cache)
    assert export_for_vllm(md, cache) == first and llm_fingerprint(md, cache) == fp
    assert sum(calls.values()) == 1  # size and times unchanged: the sidecar answers, no rehash
    assert served_model_name(fp) == "cosyvoice2-" + fp[:16]

    # a fine-tune of the same shapes, copied with its old mtime kept (cp -p): same size and mtime
    st = (md / LLM).stat()
    sd["llm_decoder.bias"][0] += 1.0
    torch.save(sd, md / LLM)
    os.utime(md / LLM, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert (md / LLM).stat().st_size == st.st_size and (md / LLM).stat().st_mtime_ns == st.st_mtime_ns
    second = export_for_vllm(md, cache)
    assert second != first and first.is_dir() and sum(calls.values()) == 2
    with safe_open(str(second / "model.safetensors"), "pt") as f:
        assert torch.equal(f.get_tensor("lm_head.bias"), sd["llm_decoder.bias"])


def test_read_only_model_dir_and_concurrent_exports(tiny_model_dir, tmp_path):
    md = copy_lm_files(tiny_model_dir, tmp_path / "model")
    paths = sorted(md.rglob("*"))
    for p in [*paths, md]:
        p.chmod(0o555 if p.is_dir() else 0o444)
    before = {p: p.stat().st_mtime_ns for p in paths}
    try:
        cache = tmp_path / "cache"
        with ThreadPoolExecutor(4) as pool:  # several starters at once: one export, no partial dirs
            outs = set(pool.map(lambda _: export_for_vllm(md, cache), range(4)))
        assert len(outs) == 1
        assert [p.name for p in (cache / "vllm").iterdir() if p.is_dir()] == [outs.pop().name]
        assert sorted(md.rglob("*")) == paths and {p: p.stat().st_mtime_ns for p in paths} == before
    finally:
        for p in [md, *paths]:
            p.chmod(0o755 if p.is_dir() else 0o644)


# ---- the logits processor, without a server --------------------------------------------------------------

def _processor():
    from cosy.vllm_plugin import hide_torch_addons

    hide_torch_addons()  # vllm imports transformers, which imports the CUDA-only torchvision of the CPU install
    from vllm import SamplingParams as VllmParams
    from vllm.v1.sample.logits_processor import BatchUpdate, MoveDirectionality

    from cosy.vllm_plugin.ras import CosyLogitsProcessor
    # what the processor reads of vLLM's config: the exported config.json's family
    config = SimpleNamespace(model_config=SimpleNamespace(hf_config=SimpleNamespace(cosy_family=CV2.name)))
    return CosyLogitsProcessor(config, torch.device("cpu"), False), VllmParams, BatchUpdate, MoveDirectionality


def test_processor_gives_exact_ras_rows_and_tracks_the_batch():
    proc, VllmParams, BatchUpdate, Move = _processor()
    p = SamplingParams()
    ras = {"cosy_ras": 1, "cosy_top_p": p.top_p, "cosy_top_k": p.top_k, "cosy_win": p.win_size, "cosy_tau": p.tau_r}
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(4, 6564, generator=gen) * 3
    top = [row.argsort(descending=True)[:6].tolist() for row in logits]
    outs = [[top[0][0], top[0][1], top[0][0]], [], [5], [top[3][2]] * 3 + [top[3][0]]]
    params = [VllmParams(extra_args={**ras, "cosy_min_len": 5}), VllmParams(temperature=0.7),
              VllmParams(temperature=0.0, extra_args={"cosy_min_len": 2}), VllmParams(extra_args=ras)]
    proc.update_state(BatchUpdate(4, [], [(i, params[i], None, outs[i]) for i in range(4)], []))

    def check(rows: dict[int, int]) -> None:  # batch row -> request
        x = torch.stack([logits[rows[r]] for r in range(len(rows))])
        y = proc.apply(x.clone())
        for r, req in rows.items():
            if req in (0, 3):
                want = ras_distribution(logits[req], outs[req], p, mask_eos=len(outs[req]) < (5 if req == 0 else 0),
                                        tokens=TOKENS)
                torch.testing.assert_close(y[r].double().softmax(0), want, atol=1e-6, rtol=0)
            elif req == 2 and len(outs[2]) < 2:
                assert y[r, 6561] == float("-inf") and torch.equal(y[r, :6561], logits[2, :6561])
            else:
                assert torch.equal(y[r], logits[req])

    check({0: 0, 1: 1, 2: 2, 3: 3})
    for out, tok in zip(outs, (top[0][1], 9, 6, top[3][1])):
        out.append(tok)  # vLLM appends to the live lists between steps
    proc.update_state(None)
    check({0: 0, 1: 1, 2: 2, 3: 3})
    # request 1 leaves, 3 moves into its row, 0 and 2 swap
    proc.update_state(BatchUpdate(3, [1], [], [(3, 1, Move.UNIDIRECTIONAL), (0, 2, Move.SWAP)]))
    check({0: 2, 1: 3, 2: 0})
    assert set(proc.requests) == {0, 1, 2}


def test_processor_validates_params():
    proc, VllmParams, _, _ = _processor()
    assert proc.validate_params(VllmParams(extra_args={"other": 1})) is None
    proc.validate_params(VllmParams(temperature=0.0, extra_args={"cosy_min_len": 3}))
    for bad in ({"cosy_min_len": -1}, {"cosy_min_len": 1.5}, {"cosy_ras": 2}, {"cosy_ras": 1, "cosy_top_p": 0},
                {"cosy_ras": 1, "cosy_top_k": 0}, {"cosy_typo": 1}):
        with pytest.raises(ValueError):
            proc.validate_params(VllmParams(extra_args=bad))
    with pytest.raises(ValueError, match="plain sampling"):  # vLLM would reshape our distribution
        proc.validate_params(VllmParams(temperature=0.8, extra_args={"cosy_ras": 1}))
    with pytest.raises(ValueError, match="plain sampling"):
        proc.validate_params(VllmParams(top_k=25, extra_args={"cosy_ras": 1}))


# ---- launch/backend.py ---------------------------------------------------------------------------------

def _run_backend(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "COSY_LLM_API_KEY"}
    return subprocess.run([sys.executable, str(BACKEND), *args], capture_output=True, text=True, cwd=ROOT,
                          env=env, timeout=timeout)


def test_backend_refuses_bad_arguments(tiny_model_dir, tmp_path):
    r = _run_backend("--model_dir", str(tmp_path / "nope"), "--api_key", "k")
    assert r.returncode == 2 and "does not exist" in r.stderr and r.stdout == ""
    r = _run_backend("--model_dir", str(tiny_model_dir))
    assert r.returncode == 2 and "--no_api_key" in r.stderr


def test_backend_reports_a_child_that_dies(tiny_model_dir, tmp_path):
    r = _run_backend("--model_dir", str(tiny_model_dir), "--no_api_key", "--port", str(free_port()),
                     "--cache_dir", str(tmp_path), "--", "--no-such-vllm-flag")
    assert r.returncode != 0 and READY not in r.stdout
    assert "last lines of vLLM's log" in r.stderr and "--no-such-vllm-flag" in r.stderr
    assert "cosy backend failed to start" in r.stderr


# ---- the server ---------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def peaked_backend(request):
    """A backend on conftest's peaked model (launched with the session's: conftest.SHARED_BACKENDS)."""
    with launched_backend(request, "peaked_backend") as b:
        yield b


def test_ras_redraws_repeats_through_the_server(peaked_backend, peaked_model_dir):
    """A model whose logits are a constant peaked bias (conftest.PEAKED_BIAS), so every step has the same
    distribution and the first token is in the second step's nucleus: 2-token completions must never
    repeat (a sampler without RAS would, ~1 time in 6), and both tokens follow RAS exactly (chi-square at
    ALPHA)."""
    bias = torch.load(peaked_model_dir / LLM, weights_only=True)["llm_decoder.bias"]
    assert {t: round(float(bias[t]), 3) for t in PEAKED_BIAS} == PEAKED_BIAS and bias.max() == bias[6561]
    n, p = 300, SamplingParams()
    p1 = ras_distribution(bias, [], p, mask_eos=True, tokens=TOKENS)  # eos 6561 (the largest logit) masked: min_len 2
    p2 = sum(p1[t] * ras_distribution(bias, [t], p, mask_eos=True, tokens=TOKENS)
             for t in p1.nonzero().flatten().tolist())
    assert (p1 > 0).sum() >= 4 and float((p1 ** 2).sum()) > 0.1  # without RAS: > 10 % repeats
    hidden = json.loads((peaked_model_dir / QWEN_DIR / "config.json").read_text())["hidden_size"]
    pairs = _draw_many(peaked_backend, _ras_body(encode_embeds(torch.randn(6, hidden)), p, min_len=2), n,
                       max_tokens=2)
    assert all(len(pair) == 2 for pair in pairs)
    assert not [pair for pair in pairs if pair[0] == pair[1]]
    assert _chi_square_p(collections.Counter(a for a, _ in pairs), p1, n) > ALPHA
    assert _chi_square_p(collections.Counter(c for _, c in pairs), p2, n) > ALPHA


def test_a_first_chunk_decoded_apart_keeps_the_ras_window(peaked_backend, peaked_model_dir):
    """The same 2-token draws as above, each split after its first token into two requests
    (`cosy.lm.first_chunk`, as a streamed utterance's first chunk is): the second request's RAS window starts
    with the first token and it still masks eos, so pairs never repeat and the second token follows the
    unsplit distribution."""
    from cosy.lm.pool import BackendPool
    from cosy.lm.prompt import PromptEmbedder
    from cosy.lm.remote import RemoteLM
    bias = torch.load(peaked_model_dir / LLM, weights_only=True)["llm_decoder.bias"]
    n, p = 300, SamplingParams()
    p1 = ras_distribution(bias, [], p, mask_eos=True, tokens=TOKENS)
    p2 = sum(p1[t] * ras_distribution(bias, [t], p, mask_eos=True, tokens=TOKENS)
             for t in p1.nonzero().flatten().tolist())
    embedder = PromptEmbedder.from_model_dir(peaked_model_dir)
    pool = BackendPool([RemoteLM(peaked_backend.url, peaked_backend.api_key, peaked_backend.model_name)])
    pool.embed_speech = embedder.speech
    x = torch.randn(1, 6, embedder.hidden_size)
    with ThreadPoolExecutor(16) as workers:
        pairs = list(workers.map(lambda seed: list(pool.generate(x, 2, 2, seed=seed, first=1)), range(n)))
    assert all(len(pair) == 2 for pair in pairs)
    assert not [pair for pair in pairs if pair[0] == pair[1]]
    assert _chi_square_p(collections.Counter(c for _, c in pairs), p2, n) > ALPHA


def test_a_graceful_stop_exits_0_and_frees_the_port(peaked_backend):
    """SIGTERM (what `podman stop` and Kubernetes send): the backend stops vLLM, exits 0 and frees its port
    for a restart on it. Checked on the peaked backend once its module is done with it, so that it costs no
    start (the shared backend's kill and restart: test_faults.py). On the CPU the model runs in vLLM's engine
    process, with no worker process beside it (cosy.deploy.backend), and no process of it outlives the stop."""
    import psutil
    assert httpx.get(peaked_backend.url.removesuffix("/v1") + "/health", timeout=10).status_code == 200
    tree = [psutil.Process(peaked_backend.proc.pid), *psutil.Process(peaked_backend.proc.pid).children(recursive=True)]
    names = [" ".join(p.cmdline()) for p in tree]  # vLLM's processes name themselves there (setproctitle)
    assert [n for n in names if "VLLM::EngineCore" in n] and not [n for n in names if "Worker" in n], names
    # vLLM's temp files (its rendezvous file, its IPC sockets) lie in the backend's own temp dir, not the temp
    # dir that every process shares, and go with it: they outlived even a clean stop there
    own = Path(tempfile.gettempdir()) / f"{backend_launcher.TEMP_PREFIX}{peaked_backend.proc.pid}"
    assert list(own.glob("vllm_dist_*")), sorted(p.name for p in own.iterdir())
    assert peaked_backend.stop() == 0
    assert not [p for p in psutil.wait_procs(tree, timeout=30)[1]], "processes of the backend outlived its stop"
    assert not own.exists() and not list(Path(tempfile.gettempdir()).glob("vllm_dist_*"))
    with pytest.raises(httpx.TransportError):
        httpx.get(peaked_backend.url.removesuffix("/v1") + "/health", timeout=2)
    with socket.socket() as s:  # nothing of it (vLLM's API server, its engine) holds it; a restart binds it
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn does: clients' TIME_WAITs stay
        s.bind(("127.0.0.1", peaked_backend.port))
        s.listen()


def test_models_health_and_auth(backend):
    headers = {"Authorization": f"Bearer {backend.api_key}"}
    models = httpx.get(f"{backend.url}/models", headers=headers).json()
    assert [m["id"] for m in models["data"]] == [backend.model_name]
    assert httpx.get(backend.url.removesuffix("/v1") + "/health").status_code == 200
    assert httpx.get(f"{backend.url}/models").status_code == 401
    assert httpx.get(f"{backend.url}/models", headers={"Authorization": "Bearer wrong"}).status_code == 401


def held(pid: int) -> dict[int, tuple[str, int]]:
    """The sockets and pipes process `pid` holds: fd -> (its inode, as /proc names it, and its access mode: the two
    ends of a pipe share the inode)."""
    out = {}
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
            flags = int(Path(f"/proc/{pid}/fdinfo/{fd}").read_text().split("flags:")[1].split()[0], 8)
        except (OSError, IndexError):  # closed meanwhile
            continue
        if target.startswith(("socket:", "pipe:")):
            out[int(fd)] = (target, flags & os.O_ACCMODE)
    return out


def test_cpu_engine_core_is_forked_without_unused_modules_or_the_servers_descriptors(backend):
    """cosy.vllm_plugin.serve: the engine core is forked from the API server (inheriting its imports), not
    spawned (which re-imports vLLM and torch: 10 CPU s a start), and neither process loaded scikit-learn or a
    torch add-on. A spawn shows as multiprocessing's resource tracker beside the engine. The forked engine
    holds none of the server's sockets and pipes (its listening socket, its event loop's, its ZeroMQ
    sockets): only its stdout and stderr, and multiprocessing's own pipe ends between the two."""
    import psutil

    server, = psutil.Process(backend.proc.pid).children()
    assert "cosy.vllm_plugin.serve" in server.cmdline()
    children = server.children()
    assert [c.name() for c in children] == ["VLLM::EngineCore"], [c.cmdline() for c in children]
    unused = ("sklearn", "scikit_learn", "torchvision", "torchaudio", "torchcodec")
    for p in (server, *children):
        parts = [Path(m.path).parts for m in p.memory_maps() if "site-packages" in m.path]
        loaded = {ps[ps.index("site-packages") + 1] for ps in parts}  # the packages whose libraries it mapped
        assert "torch" in loaded and not {d for d in loaded if d.startswith(unused)}, (p.name(), sorted(loaded))
    engine, = children
    assert not [c for c in engine.net_connections("inet") if c.status == psutil.CONN_LISTEN
                and c.laddr.port == backend.port]  # the server's port: held by a live engine of a dead server
    mine, its = held(engine.pid), held(server.pid)
    stdio = {mine.get(1), mine.get(2)}
    shared = {fd: what for fd, what in mine.items() if what in its.values() and what not in stdio}
    assert not shared, (shared, mine, its)


@pytest.fixture(scope="module")
def tiny_lm(tiny_model_dir) -> SpeechLM:
    return SpeechLM.from_model_dir(tiny_model_dir)


def encode_embeds(x: torch.Tensor) -> str:
    buf = io.BytesIO()
    torch.save(x.reshape(-1, x.size(-1)).clone(), buf)
    return base64.b64encode(buf.getvalue()).decode()


def test_stream_greedy_matches_embedded_lm(backend, tiny_lm):
    x = tiny_lm.prompt_embeds(TEXT, PROMPT_TEXT, PROMPT_SPEECH)
    min_len, max_len = tiny_lm.length_limits(len(TEXT))
    want = list(tiny_lm.generate(x, min_len, max_len, params=SamplingParams(greedy=True)))
    client = openai.OpenAI(base_url=backend.url, api_key=backend.api_key)
    stream = client.completions.create(
        model=backend.model_name, prompt=None, max_tokens=max_len, temperature=0.0, stream=True,
        extra_body={"prompt_embeds": encode_embeds(x), "return_token_ids": True,
                    "stop_token_ids": list(STOP_TOKENS), "vllm_xargs": {"cosy_min_len": min_len}})
    chunks = [c.choices[0] for c in stream]
    # streamed: usually one token per chunk, but vLLM merges the deltas of a reader that lags behind
    assert len(chunks) > 1 and all(c.model_extra["token_ids"] for c in chunks[:-1])
    got = [t for c in chunks for t in c.model_extra["token_ids"]]
    if chunks[-1].finish_reason == "stop":
        assert got.pop() in STOP_TOKENS  # vLLM returns the stop id; the embedded LM does not yield it
    assert got == want and len(got) >= min_len


def _chi_square_p(counts: collections.Counter, probs: torch.Tensor, n: int) -> float:
    """p-value of Pearson's chi-square test; bins with expected < 5 pooled (fails on impossible draws)."""
    impossible = [t for t in counts if probs[t] <= 0]
    assert not impossible, f"drew tokens of probability 0: {impossible}"
    support = probs.nonzero().flatten().tolist()
    big = [t for t in support if n * probs[t] >= 5]
    bins = [(counts[t], n * float(probs[t])) for t in big]
    rest = [t for t in support if t not in set(big)]
    if rest:
        pooled = (sum(counts[t] for t in rest), n * float(probs[rest].sum()))
        if pooled[1] < 5 and bins:  # still too small: merge with the smallest bin
            i = min(range(len(bins)), key=lambda j: bins[j][1])
            pooled = (pooled[0] + bins[i][0], pooled[1] + bins.pop(i)[1])
        bins.append(pooled)
    stat = sum((o - e) ** 2 / e for o, e in bins)
    df = len(bins) - 1
    return float(torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64),
                                         torch.tensor(stat / 2, dtype=torch.float64))) if df > 0 else 1.0


def _ras_body(embeds: str, p: SamplingParams, min_len: int) -> dict:
    return {"prompt_embeds": embeds, "return_token_ids": True, "top_k": -1,
            "vllm_xargs": {"cosy_min_len": min_len, "cosy_ras": 1, "cosy_top_p": p.top_p, "cosy_top_k": p.top_k,
                           "cosy_win": p.win_size, "cosy_tau": p.tau_r}}


def _draw_many(b: Backend, body: dict, n: int, max_tokens: int) -> list[list[int]]:
    """n concurrent seeded completions (seeds 0..n-1); their token ids."""
    client = openai.OpenAI(base_url=b.url, api_key=b.api_key, max_retries=0)

    def draw(seed: int) -> list[int]:
        r = client.completions.create(model=b.model_name, prompt=None, max_tokens=max_tokens, temperature=1.0,
                                      top_p=1.0, seed=seed, extra_body=body)
        return r.choices[0].model_extra["token_ids"]

    with ThreadPoolExecutor(32) as pool:
        return list(pool.map(draw, range(n)))


def test_ras_first_token_matches_embedded_lm(backend, tiny_lm):
    """N seeded first tokens (history empty: the nucleus) against ras_distribution of our LM's logits."""
    n, p = 300, tiny_lm.sampling
    x = tiny_lm.prompt_embeds(TEXT, PROMPT_TEXT, PROMPT_SPEECH)
    logp0 = tiny_lm.teacher_forced_logprobs(x, [0])[0][0]
    top = logp0.exp().sort(descending=True).values
    assert (top[p.top_k - 1] - top[p.top_k]) / top[p.top_k - 1] > 1e-3  # no near-tie at the nucleus edge
    body = _ras_body(encode_embeds(x), p, min_len=1)
    firsts = _draw_many(backend, body, n, max_tokens=1)
    assert all(len(t) == 1 for t in firsts)
    want = ras_distribution(logp0, [], p, True, tokens=TOKENS)
    assert _chi_square_p(collections.Counter(t[0] for t in firsts), want, n) > ALPHA
    assert _draw_many(backend, body, 8, max_tokens=1) == firsts[:8]  # same seeds, same tokens

