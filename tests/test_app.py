"""The frontend app as users run it: `python app.py ...` processes, called through gradio_client.

Two apps share one data dir (A with 2 workers, B with 1 and room for 1 waiting request); both use the
embedded LM (the default)."""
from __future__ import annotations

import re
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
import soundfile as sf
from conftest import ASSETS
from gradio_client import Client, handle_file
from servers import metric, start_apps

ROOT = Path(__file__).resolve().parents[1]
ZS_WAV = str(ASSETS / "zero_shot_prompt.wav")
CL_WAV = str(ASSETS / "cross_lingual_prompt.wav")
ZS_TEXT = "希望你以后能够做的比我还好呦。"
TRAILING = ["hot_fix", "language_hints", "enable_markdown_filter"]
ENDPOINTS = {
    # later parameters trail with defaults (a call without them works as before): hot_fix, then the text controls
    "/zero_shot": ["tts_text", "prompt_text", "prompt_wav", "seed", "speed", "enable_ssml", *TRAILING],
    "/cross_lingual": ["tts_text", "prompt_wav", "seed", "speed", "enable_ssml", *TRAILING],
    "/instruct": ["tts_text", "instruct_text", "prompt_wav", "seed", "speed", "enable_ssml", *TRAILING],
    "/saved_voice": ["tts_text", "voice_id", "seed", "speed", "enable_ssml", *TRAILING],
    "/save_voice": ["voice_id", "prompt_text", "prompt_wav"],
    "/list_voices": [],
    "/speak_with_timestamps": ["tts_text", "mode", "voice_id", "prompt_wav", "prompt_text", "instruct_text", "seed",
                               "speed", "enable_ssml", "word_timestamp_enabled", "subtitle_format"],
}


@pytest.fixture(scope="module")
def apps(tiny_model_dir, tmp_path_factory):
    data = tmp_path_factory.mktemp("shared_data")
    common = ["--model_dir", str(tiny_model_dir), "--data_dir", str(data)]
    a, b = start_apps(common + ["--workers", "2"], common + ["--workers", "1", "--max_batch", "1", "--max_queue", "1"])
    yield a, b
    a.stop()
    b.stop()


@pytest.fixture(scope="module")
def client_a(apps):
    return apps[0].client()


@pytest.fixture(scope="module")
def client_b(apps):
    return apps[1].client()


def assert_wav(path: str) -> float:
    info = sf.info(path)
    assert info.samplerate == 24000 and info.frames > 0
    return info.duration


def test_view_api_names_are_the_promised_ones(client_a):
    named = client_a.view_api(print_info=False, return_format="dict")["named_endpoints"]
    assert set(named) == set(ENDPOINTS)
    for name, params in ENDPOINTS.items():
        assert [p["parameter_name"] for p in named[name]["parameters"]] == params, name
        files = [p["parameter_name"] for p in named[name]["parameters"] if p["python_type"]["type"] == "filepath"]
        assert files == (["prompt_wav"] if "prompt_wav" in params else []), name
        returns_file = named[name]["returns"][0]["python_type"]["type"] == "filepath"
        assert returns_file == (name not in ("/save_voice", "/list_voices")), name
    returns = [r["python_type"]["type"] for r in named["/speak_with_timestamps"]["returns"]]
    assert returns == ["filepath", "dict(str, Any)", "filepath"]  # the wav, its timings, the subtitles


def test_every_endpoint_gives_audio_or_json(client_a):
    c = client_a
    assert assert_wav(c.predict("你好。", ZS_TEXT, handle_file(ZS_WAV), 1, 1.0, api_name="/zero_shot")) > 0
    assert assert_wav(c.predict("你好。", handle_file(CL_WAV), 2, 1.0, api_name="/cross_lingual")) > 0
    assert assert_wav(c.predict("你好。", "用四川话说这句话", handle_file(ZS_WAV), 3, 1.5,
                                api_name="/instruct")) > 0
    saved = c.predict("endpoint-voice", ZS_TEXT, handle_file(ZS_WAV), api_name="/save_voice")
    assert saved["voice_id"] == "endpoint-voice" and saved["prompt_text"] == ZS_TEXT
    assert "endpoint-voice" in [v["voice_id"] for v in c.predict(api_name="/list_voices")]
    assert assert_wav(c.predict("你好。", "endpoint-voice", 1, 1.0, api_name="/saved_voice")) > 0


def test_speak_with_timestamps_gives_the_audio_its_sentences_and_subtitles(client_a):
    from test_timestamps_http import TWO, assert_sentences
    wav, timings, srt = client_a.predict(TWO, "cross_lingual", "", handle_file(CL_WAV), "", "", 3, 1.0, False,
                                         False, "srt", api_name="/speak_with_timestamps")
    audio, rate = sf.read(wav, dtype="int16")
    assert rate == 24000 and timings["text"] == TWO
    sentences = timings["sentences"]
    assert len(sentences) == 2
    assert_sentences(sentences, TWO, len(audio))
    # the same request without timings: the same audio (the seed fixes it; timings change no sample)
    assert (sf.read(client_a.predict(TWO, handle_file(CL_WAV), 3, 1.0, api_name="/cross_lingual"),
                    dtype="int16")[0] == audio).all()

    def stamp(ms: int, sep: str) -> str:
        return f"{ms // 3600000:02d}:{ms // 60000 % 60:02d}:{ms // 1000 % 60:02d}{sep}{ms % 1000:03d}"

    cues = Path(srt).read_text(encoding="utf-8").strip().split("\n\n")
    assert Path(srt).suffix == ".srt" and len(cues) == 2
    for i, (cue, s) in enumerate(zip(cues, sentences)):
        assert cue.split("\n") == [str(i + 1), f"{stamp(s['begin_time'], ',')} --> {stamp(s['end_time'], ',')}",
                                   s["text"]], cue
    _, _, vtt = client_a.predict(tts_text="你好。再见。", mode="cross_lingual", prompt_wav=handle_file(CL_WAV),
                                 subtitle_format="VTT", api_name="/speak_with_timestamps")
    assert Path(vtt).suffix == ".vtt" and Path(vtt).read_text(encoding="utf-8").startswith("WEBVTT")
    for kwargs, message in (({"subtitle_format": "ass"}, "subtitle_format 'ass'"), ({"mode": "sing"}, "mode 'sing'"),
                            ({"word_timestamp_enabled": True}, "--aligner")):
        with pytest.raises(Exception, match=re.escape(message)) as e:
            client_a.predict(tts_text="你好。", **{"mode": "cross_lingual", "prompt_wav": handle_file(CL_WAV),
                                                   **kwargs}, api_name="/speak_with_timestamps")
        assert "Traceback" not in str(e.value)


def test_metrics_count_gradio_api_syntheses_by_mode(apps, client_a):
    def count(text: str, mode: str, outcome: str) -> float:
        return metric(text, "cosy_syntheses_total", surface="gradio_api", mode=mode, outcome=outcome)

    before = httpx.get(f"{apps[0].url}metrics").text
    assert assert_wav(client_a.predict("你好。", handle_file(CL_WAV), 4, 1.0, api_name="/cross_lingual")) > 0
    with pytest.raises(Exception, match="out of range"):
        client_a.predict("你好。", handle_file(CL_WAV), 4, 3.0, api_name="/cross_lingual")
    after = httpx.get(f"{apps[0].url}metrics").text
    assert count(after, "cross_lingual", "ok") == count(before, "cross_lingual", "ok") + 1
    assert count(after, "cross_lingual", "invalid_request_error") == \
        count(before, "cross_lingual", "invalid_request_error") + 1
    assert metric(after, "cosy_first_packet_seconds_count", surface="gradio_api", mode="cross_lingual") >= 1


def test_apps_on_one_data_dir_share_saved_voices(client_a, client_b):
    client_a.predict("shared-voice", ZS_TEXT, handle_file(ZS_WAV), api_name="/save_voice")
    listed = {v["voice_id"]: v for v in client_b.predict(api_name="/list_voices")}
    assert listed["shared-voice"]["prompt_text"] == ZS_TEXT
    assert assert_wav(client_b.predict("你好。", "shared-voice", 1, 1.0, api_name="/saved_voice")) > 0


def test_two_workers_serve_two_requests_at_once(apps):
    clients = [apps[0].client() for _ in range(2)]  # one client (session) per user
    text = "今天天气很好，我们一起去公园散步。看看花草树木，心情很愉快。"

    def call(c):
        start = time.monotonic()
        path = c.predict(text, "shared-voice-2", 5, 1.0, api_name="/saved_voice")
        return start, time.monotonic(), assert_wav(path)

    clients[0].predict("shared-voice-2", ZS_TEXT, handle_file(ZS_WAV), api_name="/save_voice")
    call(clients[0])  # once alone first: the timed calls then measure synthesis, not first-call set-up
    with ThreadPoolExecutor(2) as ex:
        (s0, e0, d0), (s1, e1, d1) = ex.map(call, clients)
    overlap = min(e0, e1) - max(s0, s1)
    print(f"\n--workers 2: calls took {e0 - s0:.2f} s and {e1 - s1:.2f} s, overlapping {overlap:.2f} s "
          f"({d0:.1f} s of audio each)")
    assert d0 == d1 > 0
    assert overlap > 0.6 * min(e0 - s0, e1 - s1)


def test_past_max_queue_requests_are_refused_as_busy(apps):
    """B (1 worker, max_batch 1) runs 1 request and lets 1 wait: of 4 at once, some are refused at once with a
    clear message."""
    clients = [apps[1].client() for _ in range(4)]
    clients[0].predict("busy-voice", ZS_TEXT, handle_file(ZS_WAV), api_name="/save_voice")

    def call(c):
        try:
            return assert_wav(c.predict("今天天气很好，我们一起去公园散步。" * 3, "busy-voice", 1, 1.0,
                                        api_name="/saved_voice"))
        except Exception as e:  # noqa: BLE001 (the client raises its AppError)
            return str(e)

    with ThreadPoolExecutor(4) as ex:
        results = list(ex.map(call, clients))
    refused = [r for r in results if isinstance(r, str)]
    assert refused and any(isinstance(r, float) and r > 0 for r in results), results
    assert all("the server is busy" in r and "retry in" in r for r in refused), refused


BAD_INPUTS = [  # (endpoint, arguments, what the message must say)
    ("/zero_shot", ("你好。", ZS_TEXT, None, 1, 1.0), "needs a prompt audio"),
    ("/cross_lingual", ("你好。", ROOT / "README.md", 1, 1.0), "unsupported upload 'README.md'"),
    ("/zero_shot", ("", ZS_TEXT, ZS_WAV, 1, 1.0), "text is empty"),
    ("/instruct", ("你好。", " ", ZS_WAV, 1, 1.0), "needs an instruction"),
    ("/saved_voice", ("你好。", "nobody", 1, 1.0), "unknown voice 'nobody'"),
    ("/saved_voice", ("你好。", "../../etc/passwd", 1, 1.0), "invalid voice id '../../etc/passwd'"),
    ("/save_voice", ("../../etc/passwd", ZS_TEXT, ZS_WAV), "invalid voice id '../../etc/passwd'"),
    ("/save_voice", ("v1", "", ZS_WAV), "needs the prompt's transcript"),
    ("/zero_shot", ("你好。", ZS_TEXT, ZS_WAV, 1, 9.0), "speed 9.0 is out of range"),
]


@pytest.mark.parametrize("endpoint,args,message", BAD_INPUTS, ids=[f"{e}:{m}" for e, _, m in BAD_INPUTS])
def test_bad_input_gets_a_clear_message(client_a, endpoint, args, message):
    args = [handle_file(str(a)) if isinstance(a, Path) or a == ZS_WAV else a for a in args]
    with pytest.raises(Exception) as e:
        client_a.predict(*args, api_name=endpoint)
    assert message in str(e.value) and "Traceback" not in str(e.value)


def test_a_server_path_is_not_a_prompt(client_a):
    """A bare string is not an upload: the server never reads a file a client names."""
    raw = Client(client_a.src, verbose=False, download_files=False)
    with pytest.raises(Exception, match="must be an uploaded file") as e:
        raw.predict("你好。", "/etc/passwd", 1, 1.0, api_name="/cross_lingual")
    assert "Traceback" not in str(e.value)


def test_a_bad_model_dir_stops_the_start_with_a_message(tmp_path):
    run = subprocess.run([sys.executable, "app.py", "--model_dir", str(tmp_path / "nothing"), "--data_dir",
                          str(tmp_path / "data")], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert run.returncode == 2 and "error: " in run.stderr and "no such model directory" in run.stderr
    assert "Traceback" not in run.stderr + run.stdout


def test_lm_backend(backend, tiny_model_dir, tmp_path):
    """With --llm_base_url the workers ask the vLLM backend for speech tokens."""
    (app,) = start_apps(["--model_dir", str(tiny_model_dir), "--data_dir", str(tmp_path), "--llm_base_url",
                         backend.url, "--llm_api_key", backend.api_key])
    try:
        assert assert_wav(app.client().predict("你好。", ZS_TEXT, handle_file(ZS_WAV), 1, 1.0,
                                               api_name="/zero_shot")) > 0
    finally:
        app.stop()
