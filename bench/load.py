"""A bounded load generator for cosy frontends over the HTTP APIs (used by bench/deployment.py).

One request = one streamed synthesis over the PAI SSE API or the OpenAI API (pcm, chunked audio), in one mode:
    voice          a saved reference audio (PAI fast_replication / OpenAI voice without instructions)
    zero_shot      upload the prompt, then as `voice` (the upload, i.e. the prompt features, is in the time)
    cross_lingual  PAI cross_lingual_replication with the saved reference (no OpenAI form)
    instruct       PAI natural_language_replication / OpenAI `instructions`, saved reference
Each result: ok, first-packet seconds (from sending the request), total seconds, audio seconds.
"""
from __future__ import annotations

import base64
import itertools
import json
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import httpx
from voice_prompt import PROMPT_TEXT, PROMPT_WAV, TEXT

INSTRUCT = "用开心的语气说这句话"
RATE = 24000
MODES = ("zero_shot", "cross_lingual", "instruct", "voice")
PAI_MODES = {"zero_shot": "fast_replication", "voice": "fast_replication",
             "cross_lingual": "cross_lingual_replication", "instruct": "natural_language_replication"}
OPENAI_MODES = ("zero_shot", "voice", "instruct")


@dataclass
class Result:
    mode: str
    api: str
    ok: bool
    first: float = float("nan")
    total: float = float("nan")
    audio: float = 0.0
    error: str = ""


@dataclass
class Target:
    """A frontend and what it needs: its base URL, the API key, a saved reference id (made by `prepare`)."""

    url: str
    key: str | None = None
    ref: str = ""
    headers: dict = field(default_factory=dict)

    def __post_init__(self):
        self.url = self.url.rstrip("/")
        self.headers = {"Authorization": f"Bearer {self.key}"} if self.key else {}


def upload(t: Target, client: httpx.Client) -> str:
    with open(PROMPT_WAV, "rb") as f:
        r = client.post(f"{t.url}/api/v1/audio/reference_audio", files={"file": ("prompt.wav", f, "audio/wav")},
                        data={"text": PROMPT_TEXT}, headers=t.headers, timeout=300)
    r.raise_for_status()
    return r.json()["id"]


def prepare(t: Target) -> Target:
    with httpx.Client() as c:
        t.ref = upload(t, c)
    return t


def _pai(t: Target, c: httpx.Client, mode: str, ref: str, seed: int, start: float) -> tuple[float, float]:
    inp = {"mode": PAI_MODES[mode], "text": TEXT, "reference_audio_id": ref, "output_format": "pcm", "seed": seed}
    if mode == "instruct":
        inp["instruct"] = INSTRUCT
    first, samples = None, 0
    with c.stream("POST", f"{t.url}/api/v1/audio/speech", json={"model": "CosyVoice2-0.5B", "input": inp},
                  headers=t.headers, timeout=600) as r:
        if r.status_code != 200:
            raise RuntimeError(f"HTTP {r.status_code}: {r.read()[:200]!r}")
        for line in r.iter_lines():
            if not line.startswith("data:"):
                continue
            event = json.loads(line[5:])
            if event.get("error"):
                raise RuntimeError(f"stream error: {event['error']}")
            first = first or time.perf_counter() - start
            samples += len(base64.b64decode(event["output"]["audio"]["data"])) // 2
    return first, samples / RATE


def _openai(t: Target, c: httpx.Client, mode: str, ref: str, seed: int, start: float) -> tuple[float, float]:
    body = {"model": "CosyVoice2-0.5B", "input": TEXT, "voice": ref, "response_format": "pcm", "seed": seed}
    if mode == "instruct":
        body["instructions"] = INSTRUCT
    first, n = None, 0
    with c.stream("POST", f"{t.url}/v1/audio/speech", json=body, headers=t.headers, timeout=600) as r:
        if r.status_code != 200:
            raise RuntimeError(f"HTTP {r.status_code}: {r.read()[:200]!r}")
        for piece in r.iter_bytes():
            if piece:
                first = first or time.perf_counter() - start
                n += len(piece)
    return first, n / 2 / RATE


def one(t: Target, mode: str, api: str, seed: int) -> Result:
    start = time.perf_counter()
    try:
        with httpx.Client() as c:
            ref = upload(t, c) if mode == "zero_shot" else t.ref
            first, audio = (_pai if api == "pai" else _openai)(t, c, mode, ref, seed, start)
        if not audio:
            raise RuntimeError("no audio")
        return Result(mode, api, True, first, time.perf_counter() - start, audio)
    except Exception as e:  # a failed request is a result, counted in the success rate
        return Result(mode, api, False, error=f"{type(e).__name__}: {e}"[:300])


def plan(modes: list[str], apis: list[str], n: int) -> list[tuple[str, str]]:
    """n (mode, api) pairs cycling over every valid combination (cross_lingual has no OpenAI form)."""
    combos = [(m, a) for m in modes for a in apis if a == "pai" or m in OPENAI_MODES]
    return list(itertools.islice(itertools.cycle(combos), n))


def run_level(targets: list[Target], modes: list[str], apis: list[str], concurrency: int,
              requests: int) -> tuple[list[Result], float]:
    """`requests` requests, at most `concurrency` in flight, spread over the frontends; (results, wall s)."""
    work = plan(modes, apis, requests)
    start = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        results = list(pool.map(lambda i: one(targets[i % len(targets)], *work[i], seed=i), range(len(work))))
    return results, time.perf_counter() - start


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


def summarize(results: list[Result], wall: float) -> dict:
    ok = [r for r in results if r.ok]
    firsts, rtfs = [r.first for r in ok], [r.total / r.audio for r in ok]
    return {"requests": len(results), "success": len(ok) / len(results) if results else 0.0,
            "first_p50": statistics.median(firsts) if ok else float("nan"), "first_p95": _pct(firsts, 0.95),
            "first_p99": _pct(firsts, 0.99), "rtf_p50": statistics.median(rtfs) if ok else float("nan"),
            "rtf_p95": _pct(rtfs, 0.95), "audio_per_wall": sum(r.audio for r in ok) / wall, "wall": wall,
            "errors": sorted({r.error for r in results if not r.ok})[:3]}
