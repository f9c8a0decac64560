"""The shared lexicon over HTTP on two real frontends sharing one data dir: an entry added, changed or deleted
on one is used by the other's next request without a restart; the routes need the key; a bad entry is a 400
naming the problem; a lexicon file broken by hand leaves both serving with its last good entries."""
from __future__ import annotations

import base64

import httpx
import pytest
from conftest import ASSETS
from servers import start_apps

KEY = "lexicon-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
LEXICON = "api/v1/lexicon"


@pytest.fixture(scope="module")
def apps(tiny_model_dir, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("lexicon_api")
    (tmp / "key").write_text(KEY)
    common = ["--model_dir", str(tiny_model_dir), "--data_dir", str(tmp / "data"), "--api_key_file",
              str(tmp / "key")]
    a, b = start_apps(common, common)
    r = httpx.post(a.url + "api/v1/audio/reference_audio", headers=AUTH, timeout=120,
                   data={"text": "希望你以后能够做的比我还好呦。"},
                   files={"file": ("p.wav", (ASSETS / "zero_shot_prompt.wav").read_bytes())})
    assert r.status_code == 200, r.text
    yield a, b, r.json()["id"], tmp / "data"
    a.stop()
    b.stop()


def _speak(app, voice: str, text: str) -> bytes:
    r = httpx.post(app.url + "api/v1/audio/speech", headers=AUTH, timeout=300, json={
        "model": "x", "stream": False, "input": {"mode": "fast_replication", "text": text, "reference_audio_id": voice,
                                                  "seed": 5}})
    assert r.status_code == 200, r.text
    return base64.b64decode(r.json()["output"]["audio"]["data"])


def test_a_change_on_one_frontend_is_used_by_the_other(apps):
    a, b, voice, data = apps
    assert httpx.get(b.url + LEXICON).status_code == 401  # behind the key
    assert httpx.post(a.url + LEXICON, json={"word": "x", "kind": "sub", "value": "y"}).status_code == 401
    r = httpx.post(a.url + LEXICON, headers=AUTH, json={"word": "WHO", "kind": "sub", "value": "世界卫生组织"})
    assert r.status_code == 201 and r.json() == {"word": "WHO", "kind": "sub", "value": "世界卫生组织"}
    listing = httpx.get(b.url + LEXICON, headers=AUTH).json()
    assert listing["entries"] == [r.json()] and listing["error"] is None
    want = _speak(b, voice, "世界卫生组织说好。")
    assert _speak(b, voice, "WHO说好。") == want  # b reads WHO as a's entry says, without a restart
    r = httpx.put(b.url + LEXICON + "/WHO", headers=AUTH, json={"kind": "sub", "value": "卫生组织"})
    assert r.status_code == 200 and httpx.get(a.url + LEXICON + "/WHO", headers=AUTH).json()["value"] == "卫生组织"
    assert _speak(a, voice, "WHO说好。") == _speak(a, voice, "卫生组织说好。")
    # a file broken by hand: both keep the last good entries, and say why
    (data / "lexicon.tsv").write_text("WHO\tsub\t卫生组织\n重庆\tpy\tchong qing4\n", encoding="utf-8")
    listing = httpx.get(b.url + LEXICON, headers=AUTH).json()
    assert "lexicon.tsv line 2: pinyin syllable 'chong' has no tone number" in listing["error"]
    assert listing["entries"] == [{"word": "WHO", "kind": "sub", "value": "卫生组织"}]
    assert _speak(b, voice, "WHO说好。") == _speak(b, voice, "卫生组织说好。")
    r = httpx.post(a.url + LEXICON, headers=AUTH, json={"word": "A", "kind": "sub", "value": "B"})
    assert r.status_code == 409 and "line 2" in r.json()["error"]["message"]
    (data / "lexicon.tsv").write_text("WHO\tsub\t卫生组织\n", encoding="utf-8")
    assert httpx.delete(a.url + LEXICON + "/WHO", headers=AUTH).json() == {"deleted": "WHO"}
    assert httpx.get(b.url + LEXICON + "/WHO", headers=AUTH).status_code == 404
    assert _speak(b, voice, "WHO说好。") != want


@pytest.mark.parametrize("body, message", [
    ({"word": "", "kind": "sub", "value": "x"}, "the word is empty"),
    ({"word": "重庆", "kind": "py", "value": "chong qing4"}, "pinyin syllable 'chong' has no tone number"),
    ({"word": "hello", "kind": "cmu", "value": "HH AH0 L OX1"}, "unknown CMU phone 'OX1'"),
    ({"word": "x", "kind": "ipa", "value": "x"}, "kind 'ipa' is not one of py"),
])
def test_a_bad_entry_is_a_400_naming_the_problem(apps, body, message):
    r = httpx.post(apps[0].url + LEXICON, headers=AUTH, json=body)
    assert r.status_code == 400 and message in r.json()["error"]["message"], r.text


def test_hot_fix_on_http_and_its_errors(apps):
    a, _, voice, _ = apps
    r = httpx.post(a.url + "api/v1/audio/speech", headers=AUTH, timeout=300, json={
        "model": "x", "stream": False, "input": {"mode": "fast_replication", "text": "去重庆。",
                                                  "reference_audio_id": voice,
                                                  "hot_fix": {"pronunciation": [{"重庆": "chong2 qing4"}]}}})
    # the tiny model is a CosyVoice2: a pronunciation is refused as <phoneme> is
    assert r.status_code == 400 and "needs a model whose tokenizer has phoneme tokens" in r.text
    r = httpx.post(a.url + "v1/audio/speech", headers=AUTH, timeout=300, json={
        "model": "x", "input": "WHO说好。", "voice": voice, "hot_fix": {"replace": [{"WHO": ""}]}})
    assert r.status_code == 400 and "the replacement of 'WHO' is empty" in r.text
    got = httpx.post(a.url + "api/v1/audio/speech", headers=AUTH, timeout=300, json={
        "model": "x", "stream": False, "input": {"mode": "fast_replication", "text": "WHO说好。", "seed": 5,
                                                  "reference_audio_id": voice,
                                                  "hot_fix": {"replace": [{"WHO": "世界卫生组织"}]}}})
    assert base64.b64decode(got.json()["output"]["audio"]["data"]) == _speak(a, voice, "世界卫生组织说好。")


def test_the_lexicon_applies_to_the_markdown_filtered_text(apps):
    """Entries are chosen on the text the engine applies them to: with the markdown filter that is the
    filtered text, where `**W**HO` has become the word WHO."""
    a, _, voice, _ = apps
    r = httpx.post(a.url + LEXICON, headers=AUTH, json={"word": "WHO", "kind": "sub", "value": "世界卫生组织"})
    assert r.status_code == 201, r.text
    try:
        got = httpx.post(a.url + "api/v1/audio/speech", headers=AUTH, timeout=300, json={
            "model": "x", "stream": False, "input": {"mode": "fast_replication", "text": "**W**HO说好。",
                                                      "reference_audio_id": voice, "seed": 5,
                                                      "enable_markdown_filter": True}})
        assert got.status_code == 200, got.text
        assert base64.b64decode(got.json()["output"]["audio"]["data"]) == _speak(a, voice, "世界卫生组织说好。")
    finally:
        httpx.delete(a.url + LEXICON + "/WHO", headers=AUTH)
