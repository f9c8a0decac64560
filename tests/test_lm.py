"""Speech-token LM: golden cases of the official Qwen2LM, official key layout, exact RAS sampling, generate()."""
from __future__ import annotations

import copy
import json
import shutil
import threading
from collections import Counter
from pathlib import Path

import pytest
import torch
from conftest import GOLDEN, reference_entries, reference_shapes
from safetensors.torch import load_file

from cosy.lm import LMConfig, SamplingParams, SpeechLM, ras_distribution, ras_sample
from cosy.lm.fixed_length import FixedLengthLM
from cosy.lm.model import LM_HEAD_KEY
from cosy.model.families.cosyvoice2 import FAMILY as CV2
from cosy.model.files import ModelDirError
from cosy.verify.random_model.llm import write_llm_pt

pytestmark = pytest.mark.quick  # the inner-loop tier (`pytest -m quick`; README "Tests")

TOKENS = CV2.tokens
EOS = TOKENS.eos

TINY = dict(hidden=64, n_layers=2, n_heads=2, n_kv_heads=1, intermediate=128)
ALPHA = 1e-3  # significance level of the chi-square goodness-of-fit tests (fixed seeds: deterministic)


# ---------------------------------------------------------------- fixtures

@pytest.fixture(scope="module")
def golden_lm() -> SpeechLM:
    return SpeechLM.from_model_dir(GOLDEN / "model")


@pytest.fixture(scope="module")
def tensors() -> dict[str, torch.Tensor]:
    return load_file(GOLDEN / "cases.safetensors")


def make_lm_dir(out: Path, hidden: int, n_layers: int, n_heads: int, n_kv_heads: int, intermediate: int,
                seed: int = 0) -> Path:
    """A model dir with just what the LM reads: the golden yaml and Qwen2 config.json at our dims, llm.pt."""
    (out / "CosyVoice-BlankEN").mkdir(parents=True)
    yaml = (GOLDEN / "model" / "cosyvoice2.yaml").read_text(encoding="utf-8")
    yaml = yaml.replace("llm_input_size: 64", f"llm_input_size: {hidden}")
    (out / "cosyvoice2.yaml").write_text(yaml.replace("llm_output_size: 64", f"llm_output_size: {hidden}"))
    cfg = json.loads((GOLDEN / "model" / "CosyVoice-BlankEN" / "config.json").read_text())
    cfg.update(hidden_size=hidden, num_hidden_layers=n_layers, num_attention_heads=n_heads,
               num_key_value_heads=n_kv_heads, intermediate_size=intermediate, vocab_size=151936)
    (out / "CosyVoice-BlankEN" / "config.json").write_text(json.dumps(cfg))
    write_llm_pt(out / "llm.pt", hidden, n_layers, n_heads, n_kv_heads, intermediate, seed)
    return out


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory) -> Path:
    return make_lm_dir(tmp_path_factory.mktemp("lm") / "tiny", **TINY)


@pytest.fixture(scope="module")
def tiny(tiny_dir) -> SpeechLM:
    return SpeechLM.from_model_dir(tiny_dir)


@pytest.fixture(scope="module")
def prompt(tiny) -> torch.Tensor:
    g = torch.Generator().manual_seed(3)
    return tiny.prompt_embeds(torch.randint(0, 151663, (12,), generator=g).tolist(),
                              torch.randint(0, 151663, (6,), generator=g).tolist(),
                              torch.randint(0, 6561, (25,), generator=g).tolist())


# ---------------------------------------------------------------- golden (official Qwen2LM, teacher forced)

@pytest.mark.parametrize("case, with_prompt, steps", [("zero_shot", True, 30), ("cross_lingual", False, 10)])
def test_golden_lm_case(golden_lm, tensors, case, with_prompt, steps):
    t = tensors
    x = golden_lm.prompt_embeds(t["lm.text"][0].tolist(),
                                t["lm.prompt_text"][0].tolist() if with_prompt else (),
                                t["lm.prompt_speech_token"][0].tolist() if with_prompt else ())
    logp, hidden = golden_lm.teacher_forced_logprobs(x, t["lm.continuation"][:steps].tolist())
    diffs = {"lm_input": (x - t[f"lm.{case}.lm_input"]).abs().max().item(),
             "logp": (logp - t[f"lm.{case}.logp"]).abs().max().item(),
             "last_hidden": (hidden - t[f"lm.{case}.last_hidden"]).abs().max().item()}
    print(case, diffs)
    assert x.shape == t[f"lm.{case}.lm_input"].shape and logp.shape == (steps, 6564)
    assert diffs["lm_input"] <= 1e-6 and diffs["logp"] <= 1e-4 and diffs["last_hidden"] <= 1e-4


# ---------------------------------------------------------------- official key layout

def test_full_size_keys_and_shapes_match_official_list():
    with torch.device("meta"):
        lm = SpeechLM(LMConfig(), CV2)
    ours = {k: tuple(v.shape) for k, v in lm.state_dict().items()}
    ref = reference_shapes("llm")
    # llm.pt also holds the tied text lm_head; we never compute it, so it is the one key we drop on load
    assert ref.pop(LM_HEAD_KEY) == ref["llm.model.model.embed_tokens.weight"] == (151936, 896)
    assert ours == ref
    assert sum(v.numel() for v in lm.parameters()) == pytest.approx(505.8e6, rel=1e-3)  # published count


def test_random_llm_pt_has_official_keys_and_tied_head(tiny_dir):
    sd = torch.load(tiny_dir / "llm.pt", weights_only=True)
    ref = [k for k, _, _ in reference_entries("llm")
           if not k.startswith("llm.model.model.layers.") or int(k.split(".")[4]) < TINY["n_layers"]]
    assert list(sd) == ref  # same keys, same order as the official file
    head, embed = sd[LM_HEAD_KEY], sd["llm.model.model.embed_tokens.weight"]
    assert head.untyped_storage().data_ptr() == embed.untyped_storage().data_ptr()
    assert embed.shape == (151936, 64) and sd["speech_embedding.weight"].shape == (6564, 64)
    assert sd["llm.model.model.layers.0.self_attn.k_proj.weight"].shape == (32, 64)
    # seeded: the same arguments give the same tensors
    again = torch.load(tiny_dir / "llm.pt", weights_only=True)
    assert all(torch.equal(sd[k], again[k]) for k in sd)


def test_from_model_dir_errors_name_the_file(tmp_path, tiny_dir):
    d = tmp_path / "m"
    shutil.copytree(tiny_dir, d)
    sd = torch.load(d / "llm.pt", weights_only=True)
    sd["extra.weight"] = torch.zeros(1)
    del sd["llm_decoder.bias"]
    torch.save(sd, d / "llm.pt")
    with pytest.raises(ModelDirError, match=r"llm\.pt does not match.*missing: llm_decoder\.bias.*extra\.weight"):
        SpeechLM.from_model_dir(d)
    cfg_path = d / "CosyVoice-BlankEN" / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg_path.write_text(json.dumps({**cfg, "hidden_size": 128}))
    with pytest.raises(ModelDirError, match=r"config\.json: hidden_size 128 differs.*llm_input_size 64"):
        SpeechLM.from_model_dir(d)
    cfg_path.unlink()
    with pytest.raises(ModelDirError, match=r"config\.json is missing"):
        SpeechLM.from_model_dir(d)


# ---------------------------------------------------------------- RAS sampling

def brute_force_ras(logits: torch.Tensor, history: list[int], p: SamplingParams, mask_eos: bool,
                    exclude_drawn: bool = True) -> torch.Tensor:
    """The official two-stage draw enumerated literally: its Python loop, then each first-stage outcome.

    exclude_drawn=False gives the textbook variant whose redraw may return the repeated token again; the
    official code masks it first (`weighted_scores[top_ids] = -inf`)."""
    w = logits.float().log_softmax(dim=0)
    if mask_eos:
        w[EOS] = float("-inf")
    values, ids = w.softmax(dim=0).sort(descending=True, stable=True)
    kept, cum = [], 0.0
    for v, i in zip(values, ids):
        if cum < p.top_p and len(kept) < p.top_k:
            cum = cum + v  # float32 tensor arithmetic, as in the official loop
            kept.append((float(v), int(i)))
        else:
            break
    total = sum(v for v, _ in kept)
    out = torch.zeros(w.numel(), dtype=torch.float64)
    for v, i in kept:
        if (torch.tensor(history[-p.win_size:], dtype=torch.long) == i).sum().item() >= p.win_size * p.tau_r:
            w2 = w.clone()
            if exclude_drawn:
                w2[i] = float("-inf")
            full = w2.softmax(dim=0).double()
            out += v / total * full / full.sum()
        else:
            out[i] += v / total
    return out


def chi_square_p(samples: list[int], expected_probs: torch.Tensor) -> tuple[float, int]:
    """Pearson chi-square goodness of fit; bins with expected count < 5 are pooled. (p-value, dof)."""
    n = len(samples)
    expected = expected_probs * n
    counts = Counter(samples)
    observed = torch.zeros_like(expected)
    for token, c in counts.items():
        observed[token] = c
    assert float(observed[expected_probs == 0].sum()) == 0, "drew a token of probability 0"
    big = expected >= 5
    obs = torch.cat([observed[big], observed[~big].sum().view(1)])
    exp = torch.cat([expected[big], expected[~big].sum().view(1)])
    keep = exp > 0
    obs, exp = obs[keep], exp[keep]
    stat = float(((obs - exp) ** 2 / exp).sum())
    dof = int(obs.numel()) - 1
    return float(torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64),
                                         torch.tensor(stat / 2, dtype=torch.float64))), dof


def _logits(v: int, scale: float, seed: int) -> torch.Tensor:
    return torch.randn(v, generator=torch.Generator().manual_seed(seed)) * scale


def _ras_cases():
    """(name, logits, history, mask_eos, nucleus size, n_samples). Histories hold nucleus tokens: R non-empty."""
    spread = _logits(1000, 2.0, 0)  # flat enough that the 25-token cap binds
    top_spread = spread.argsort(descending=True).tolist()
    peaked = _logits(300, 5.0, 1)  # the top-p cut binds first
    top_peaked = peaked.argsort(descending=True).tolist()
    eos = _logits(6564, 2.5, 2)
    eos[EOS] = eos.max() + 2.0  # eos would hold most of the mass without the mask
    top_eos = eos.argsort(descending=True).tolist()
    return [
        ("top_k cut, no repeats", spread, [], False, 25, 8000),
        ("top_k cut, top tokens repeated", spread, [top_spread[0], 7, top_spread[2], top_spread[0]] * 3, False, 25,
         8000),
        ("top_p cut, top token repeated", peaked, [top_peaked[0]] + list(range(200, 209)), False, 6, 8000),
        ("eos masked, repeats", eos, [top_eos[1], top_eos[3]], True, 25, 6000),
    ]


@pytest.mark.parametrize("name, logits, history, mask_eos, kept, n", _ras_cases(),
                         ids=[c[0].replace(" ", "_").replace(",", "") for c in _ras_cases()])
def test_ras_sampling_matches_its_exact_distribution(name, logits, history, mask_eos, kept, n):
    p = SamplingParams()
    # the nucleus, without RAS
    assert int((ras_distribution(logits, [], p, mask_eos, tokens=TOKENS) > 0).sum()) == kept
    dist = ras_distribution(logits, history, p, mask_eos, tokens=TOKENS)
    brute = brute_force_ras(logits, history, p, mask_eos)
    assert torch.allclose(dist, brute, atol=1e-12, rtol=0)
    assert abs(float(dist.sum()) - 1) < 1e-9
    if mask_eos:
        assert dist[EOS] == 0
    if history:  # R is non-empty and reached: some of the mass comes from the full-softmax redraw
        assert int((dist > 0).sum()) > kept
    g = torch.Generator().manual_seed(1234)
    samples = [ras_sample(logits, history, p, g, mask_eos, tokens=TOKENS) for _ in range(n)]
    pval, dof = chi_square_p(samples, dist)
    print(f"{name}: chi-square p = {pval:.3f} (dof {dof}, n {n}, alpha {ALPHA})")
    assert pval > ALPHA
    if history:  # the test has power: the same samples reject the variant that may redraw the repeated token
        wrong, _ = chi_square_p(samples, brute_force_ras(logits, history, p, mask_eos, exclude_drawn=False))
        print(f"{name}: chi-square p against the non-excluding variant = {wrong:.1e}")
        assert wrong < ALPHA


def test_ras_repeated_draw_is_never_the_repeated_token():
    # the official redraw masks the drawn token (weighted_scores[top_ids] = -inf) before the full softmax
    logits = torch.tensor([10.0, 0.0, 0.0, -1.0])
    p = SamplingParams()
    dist = ras_distribution(logits, [0], p, mask_eos=False, tokens=TOKENS)
    assert dist[0] == 0 and abs(float(dist.sum()) - 1) < 1e-12
    g = torch.Generator().manual_seed(0)
    assert 0 not in {ras_sample(logits, [0], p, g, False, tokens=TOKENS) for _ in range(200)}


def test_greedy_params():
    logits = _logits(6564, 2.0, 5)
    logits[EOS] = 100.0
    p = SamplingParams(greedy=True)
    g = torch.Generator()
    assert ras_sample(logits, [], p, g, mask_eos=False, tokens=TOKENS) == EOS
    masked = ras_sample(logits, [], p, g, mask_eos=True, tokens=TOKENS)
    assert masked == int(logits[:EOS].argmax()) and ras_distribution(logits, [], p, True, tokens=TOKENS)[masked] == 1


# ---------------------------------------------------------------- generate()

def test_prompt_layout_per_mode(tiny):
    text, ptext, pspeech = [5, 6, 7], [151646, 9], [1, 2, 3, 4]
    zs = tiny.prompt_embeds(text, ptext, pspeech)
    assert zs.shape == (1, 2 + 5 + 4, 64)
    w = tiny.llm_embedding.weight
    assert torch.equal(zs[0, 0], w[0]) and torch.equal(zs[0, 6], w[1])
    assert torch.equal(zs[0, 1:6], tiny.llm.model.model.embed_tokens.weight[ptext + text])
    assert torch.equal(zs[0, 7:], tiny.speech_embedding.weight[pspeech])
    assert tiny.prompt_embeds(text).shape == (1, 5, 64)  # cross-lingual
    assert tiny.prompt_embeds(text, ptext).shape == (1, 7, 64)  # instruct
    with pytest.raises(ValueError, match="prompt speech token"):
        tiny.prompt_embeds(text, (), [6561])
    with pytest.raises(ValueError, match="text"):
        tiny.prompt_embeds([151936])
    assert CV2.length_limits(16) == (32, 320)


def test_generate_is_seeded_and_leaves_global_rng_alone(tiny, prompt):
    torch.manual_seed(0)
    state = torch.get_rng_state()
    a = list(tiny.generate(prompt, 0, 40, seed=7))
    assert torch.equal(torch.get_rng_state(), state)
    torch.manual_seed(99)  # the global RNG has no say
    assert list(tiny.generate(prompt, 0, 40, seed=7)) == a
    assert list(tiny.generate(prompt, 0, 40, seed=8)) != a
    assert len(a) <= 40 and all(0 <= t < 6561 for t in a)
    assert len(list(tiny.generate(prompt, 0, 5, seed=7))) <= 5


def test_fixed_length_lm_gives_exactly_n_tokens(tiny, prompt):
    """The benchmarks' `--fixed_tokens`: exactly n speech tokens whatever min/max the request asks."""
    fixed = FixedLengthLM(tiny, 33)
    for min_len, max_len in ((0, 5), (0, 400)):
        out = list(fixed.generate(prompt, min_len, max_len, seed=1))
        assert len(out) == 33 and all(0 <= t < 6561 for t in out)
    assert fixed.sampling is tiny.sampling and fixed.prompt_embeds == tiny.prompt_embeds  # the rest passes through
    with pytest.raises(ValueError, match="fixed token count"):
        FixedLengthLM(tiny, 0)


def test_generate_from_threads_matches_sequential(tiny, prompt):
    expected = {s: list(tiny.generate(prompt, 0, 30, seed=s)) for s in range(4)}
    got = {}
    threads = [threading.Thread(target=lambda s=s: got.__setitem__(s, list(tiny.generate(prompt, 0, 30, seed=s))))
               for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert got == expected


def _with_bias(lm: SpeechLM, **bias: float) -> SpeechLM:
    lm = copy.deepcopy(lm)
    with torch.no_grad():
        for token, value in bias.items():
            lm.llm_decoder.bias[int(token[1:])] = value
    return lm


def test_min_and_max_len(tiny, prompt):
    # eos nearly certain at every step: masked before min_len, so exactly min_len tokens come out
    eager = _with_bias(tiny, t6561=40.0, t6562=-40.0, t6563=-40.0)
    assert len(list(eager.generate(prompt, 15, 50, seed=0))) == 15
    assert len(list(eager.generate(prompt, 0, 50, seed=0))) == 0
    # as in the official sampler, only 6561 is masked: 6562 (or 6563) still ends decoding before min_len
    early = _with_bias(tiny, t6562=40.0)
    assert len(list(early.generate(prompt, 15, 50, seed=0))) == 0
    # no stop token likely: max_len ends it
    never = _with_bias(tiny, t6561=-40.0, t6562=-40.0, t6563=-40.0)
    assert len(list(never.generate(prompt, 0, 23, seed=0))) == 23
    # ignore_stop (benchmarks: fixed token counts) masks every stop token at every step
    fixed = SamplingParams(ignore_stop=True)
    assert len(list(early.generate(prompt, 0, 31, seed=0, params=fixed))) == 31
    assert len(list(eager.generate(prompt, 0, 31, seed=0, params=fixed))) == 31


def test_greedy_generate_is_argmax_of_teacher_forcing(tiny, prompt):
    min_len = 6
    tokens = list(tiny.generate(prompt, min_len, 30, params=SamplingParams(greedy=True)))
    assert len(tokens) > min_len
    logp, hidden = tiny.teacher_forced_logprobs(prompt, tokens)
    logp[:min_len, EOS] = float("-inf")
    assert logp.argmax(dim=-1).tolist() == tokens
    # the KV-cache path equals one full forward over prompt + tokens; also with a chunked prefill
    x = torch.cat([prompt, tiny.speech_embedding.weight[tokens[:-1]].unsqueeze(0)], dim=1)
    from cosy.lm.qwen2 import KVCache, RotaryTable
    for chunks in ([x.size(1)], [10, x.size(1) - 10]):
        cache, rope = KVCache(tiny.cfg, x.size(1), "cpu", torch.float32), RotaryTable(tiny.cfg, x.size(1), "cpu",
                                                                                        torch.float32)
        with torch.inference_mode():
            full = torch.cat([tiny.llm.model.model(part, cache, rope) for part in x.split(chunks, dim=1)], dim=1)
        assert (full[0, prompt.size(1) - 1:] - hidden).abs().max() < 1e-5


def test_bfloat16_runs(tiny_dir, prompt):
    lm = SpeechLM.from_model_dir(tiny_dir, dtype=torch.bfloat16)
    assert lm.prompt_embeds([1, 2]).dtype == torch.bfloat16
    tokens = list(lm.generate(prompt, 0, 8, seed=0))
    assert 0 < len(tokens) <= 8
    logp, _ = lm.teacher_forced_logprobs(prompt, tokens)
    assert logp.dtype == torch.float32 and torch.isfinite(logp[:, :EOS]).all()


def test_cpu_linear_fast_path_equals_f_linear():
    from cosy.lm.qwen2 import _ONEDNN, Linear
    print("oneDNN linear in use:", _ONEDNN)
    lin = Linear(96, 200)
    x = torch.randn(1, 5, 96)
    with torch.no_grad():
        fast = lin(x)
    assert torch.allclose(fast, torch.nn.functional.linear(x, lin.weight, lin.bias), atol=1e-5, rtol=0)
    assert lin(x).requires_grad  # with autograd on it is plain F.linear


def test_grouped_attention_with_heads_expanded_equals_the_grouped_kernel():
    """CUDA in float32 expands each k/v head for its group (the memory-efficient kernel refuses enable_gqa);
    the result must be what the grouped call gives, for decode, prefill and a chunk after a cache."""
    from cosy.lm.qwen2 import grouped_attention
    g = torch.Generator().manual_seed(0)
    k, v = (torch.randn(1, 2, 9, 16, generator=g) for _ in range(2))  # 2 k/v heads for 14 query heads
    for n, kw in ((1, {}), (9, {"is_causal": True}),
                  (4, {"attn_mask": torch.ones(4, 9, dtype=torch.bool).tril(diagonal=5)})):
        q = torch.randn(1, 14, n, 16, generator=g)
        want = grouped_attention(q, k, v, False, **kw)
        assert torch.allclose(grouped_attention(q, k, v, True, **kw), want, atol=1e-6)

