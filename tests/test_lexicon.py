"""Pronunciation fixes (issue 56): a request's hot_fix and the shared lexicon give the speech tokens of the
hand-written SSML that marks the same words up (golden models, both families); malformed entries are 400s
naming the problem; the lexicon file in the data dir is re-read when it changes, and a bad file keeps the
last good entries."""
from __future__ import annotations

import pytest
import torch
from golden_engines import PROMPT

from cosy.deploy.lexicon import MAX_BYTES, MAX_ENTRIES, LexiconStore, parse_file, render
from cosy.errors import BadRequest, Conflict, NotFound, PayloadTooLarge
from cosy.pipeline.request import SynthesisRequest
from cosy.text.fixed_stream import fixed_released
from cosy.text.lexicon import Entry, LexiconError, make_entry, parse_hot_fix, request_fixes
from cosy.text.stream import stream_pieces

pytestmark = pytest.mark.quick


def _spoken(engine, rec, text: str, ssml: bool = False, hot_fix=None, lexicon=()) -> tuple[list, torch.Tensor]:
    """(the LM's tokens of each call, the audio) of a request, its fixes resolved as a frontend does."""
    req = SynthesisRequest(mode="cross_lingual", prompt_wav=PROMPT, text=text, ssml=ssml, seed=3,
                           hot_fix=parse_hot_fix(hot_fix))
    req.fixes = request_fixes(req.hot_fix, lexicon, engine.family.phoneme_tags, req.text, req.ssml)
    rec.take()
    audio = torch.cat(list(engine.synthesize(req)))
    return rec.take(), audio


@pytest.mark.parametrize("family, text, hot_fix, lexicon, ssml", [
    # a hot_fix pronunciation: CosyVoice3's <phoneme>
    ("cv3", "我们去重庆玩。", {"pronunciation": [{"重庆": "chong2 qing4"}]}, (),
     '<speak>我们去<phoneme alphabet="py" ph="chong2 qing4">重庆</phoneme>玩。</speak>'),
    # a lexicon replacement: <sub alias>; a Latin word only as a whole word (not inside "WHOM")
    ("cv3", "WHO和WHOM说的。", None, (Entry("WHO", "sub", "世界卫生组织"),),
     '<speak><sub alias="世界卫生组织">WHO</sub>和WHOM说的。</speak>'),
    ("cv2", "We see TD now.", {"replace": [{"TD": "the day"}]}, (),
     '<speak>We see <sub alias="the day">TD</sub> now.</speak>'),
    # hot_fix before the lexicon: its shorter word wins over the lexicon's longer one
    ("cv3", "重庆市很大。", {"pronunciation": [{"重庆": "zhong4 qing4"}]},
     (Entry("重庆市", "sub", "山城"),),
     '<speak><phoneme alphabet="py" ph="zhong4 qing4">重庆</phoneme>市很大。</speak>'),
    # CosyVoice2 leaves a lexicon pronunciation out (a replacement of the same lexicon applies)
    ("cv2", "And we went home.", None, (Entry("home", "cmu", "HH OW1 M"), Entry("went", "sub", "go")),
     '<speak>And we <sub alias="go">went</sub> home.</speak>'),
])
def test_fixes_give_the_tokens_of_the_equivalent_ssml(family, text, hot_fix, lexicon, ssml, request):
    engine, rec = request.getfixturevalue(family)
    tokens, audio = _spoken(engine, rec, text, hot_fix=hot_fix, lexicon=lexicon)
    want_tokens, want_audio = _spoken(engine, rec, ssml, ssml=True)
    assert tokens == want_tokens and len(tokens) >= 1 and torch.equal(audio, want_audio)


def test_in_ssml_fixes_leave_sub_say_as_and_phoneme_alone(cv3):
    engine, rec = cv3
    lexicon = (Entry("重庆", "py", "zhong4 qing4"),)
    doc = ('<speak><sub alias="重庆">CQ</sub>和<phoneme alphabet="py" ph="chong2 qing4">重庆</phoneme>'
           '和<say-as interpret-as="characters">重庆</say-as>和重庆。</speak>')
    want = ('<speak><sub alias="重庆">CQ</sub>和<phoneme alphabet="py" ph="chong2 qing4">重庆</phoneme>'
            '和<say-as interpret-as="characters">重庆</say-as>和<phoneme alphabet="py" ph="zhong4 qing4">重庆'
            '</phoneme>。</speak>')
    assert _spoken(engine, rec, doc, ssml=True, lexicon=lexicon)[0] == _spoken(engine, rec, want, ssml=True)[0]


def test_cosyvoice2_refuses_a_hot_fix_pronunciation():
    with pytest.raises(BadRequest, match="hot_fix.pronunciation .'重庆'. needs a model whose tokenizer has phoneme"):
        request_fixes(parse_hot_fix({"pronunciation": [{"重庆": "chong2 qing4"}]}), (), False, "去重庆")


@pytest.mark.parametrize("hot_fix, message", [
    ({"pronunciation": [{"": "chong2"}]}, r"hot_fix.pronunciation\[0\]: the word is empty"),
    ({"pronunciation": [{"重庆": "chong qing4"}]}, "pinyin syllable 'chong' has no tone number"),
    ({"pronunciation": [{"hello": "HH AH0 L OX1"}]}, "unknown CMU phone 'OX1'"),
    ({"pronunciation": [{"x": "HH chong2"}]}, "unknown CMU phone 'chong2'"),
    ({"pronunciation": [{"x": "chong2 HH"}]}, "mixes pinyin and CMU phones"),
    ({"pronunciation": [{"x": "ng2"}]}, "its final has no vowel"),
    ({"replace": [{"WHO": " "}]}, r"hot_fix.replace\[0\]: the replacement of 'WHO' is empty"),
    ({"replace": [{"a": "b"}, {"a": "c"}]}, "'a' appears twice"),
    ({"replace": {"a": "b"}}, "hot_fix.replace must be a list"),
    ({"speak": []}, "hot_fix has no field 'speak'"),
    ("{not json", "hot_fix is not valid JSON"),
    ({"replace": [{str(i): "x"} for i in range(201)]}, "more than 200 entries"),
])
def test_malformed_hot_fix_is_a_400_naming_the_problem(hot_fix, message):
    with pytest.raises(LexiconError, match=message) as e:
        parse_hot_fix(hot_fix)
    assert e.value.status == 400


def test_a_streamed_text_is_fixed_as_the_whole_text(cv3):
    frontend = cv3[0].text
    fixes = request_fixes((), (Entry("重庆", "py", "chong2 qing4"), Entry("WHO", "sub", "世界卫生组织")), True)
    whole = "".join(r.normalized for r in fixed_released(frontend, ["我们去重庆和WHO开会。"], fixes))
    assert whole == "我们去[ch][óng][q][ìng]和世界卫生组织开会。"
    pieces = ["我们去重", "庆和W", "HO", "开会。"]  # the words split across pieces
    runs = list(fixed_released(frontend, pieces, fixes))
    assert "".join(r.normalized for r in runs) == whole
    caller = "".join(pieces)
    assert all(r.raw == caller[r.begin:r.end] for r in runs)  # spans of the caller's text
    assert [r.raw for r in runs if r.normalized == "[ch][óng][q][ìng]"] == ["重庆"]
    # no fixes: what the plain stream makes
    assert "".join(r.normalized for r in fixed_released(frontend, pieces, ())) == "".join(
        stream_pieces(frontend, pieces))


def test_the_file_is_reread_when_it_changes_and_a_bad_one_keeps_the_last_good(tmp_path):
    store, other = LexiconStore(tmp_path / "lexicon.tsv"), LexiconStore(tmp_path / "lexicon.tsv")
    assert store.entries() == ()
    entry, new = store.put("重庆", "py", "chong2  qing4")
    assert new and entry == Entry("重庆", "py", "chong2 qing4")
    assert other.entries() == (entry,)  # a second reader (another frontend) sees it at its next look
    store.put("重庆", "py", "zhong4 qing4")  # at once: the same size, maybe the same mtime tick
    assert other.entries() == (Entry("重庆", "py", "zhong4 qing4"),)
    with pytest.raises(Conflict, match="has an entry for '重庆' already"):
        store.put("重庆", "sub", "x", create=True)
    good = other.entries()
    (tmp_path / "lexicon.tsv").write_text("# by hand\n重庆\tpy\tzhong4 qing4\nWHO\tsub\n", encoding="utf-8")
    assert other.entries() == good  # the last good entries serve
    assert other.status()["error"] == "lexicon.tsv line 3: 2 tab-separated fields; write word<TAB>kind<TAB>value"
    with pytest.raises(Conflict, match="line 3"):  # the API does not write over a file it cannot read
        store.put("WHO", "sub", "世界卫生组织")
    (tmp_path / "lexicon.tsv").write_text("重庆\tpy\tzhong4 qing4\nWHO\tsub\t世界卫生组织\n", encoding="utf-8")
    assert {e.word for e in other.entries()} == {"重庆", "WHO"} and other.status()["error"] is None
    store.delete("WHO")
    with pytest.raises(NotFound):
        store.delete("WHO")
    assert [e.word for e in other.entries()] == ["重庆"]


@pytest.mark.parametrize("text, message", [
    ("重庆\tpy\tchong qing4\n", "lexicon.tsv line 1: pinyin syllable 'chong' has no tone number"),
    ("# c\n\n\tsub\tx\n", "lexicon.tsv line 3: the word is empty"),
    ("a\tsub\tb\na\tsub\tc\n", "lexicon.tsv line 2: 'a' is given again"),
    ("a\tipa\tb\n", "lexicon.tsv line 1: kind 'ipa' is not one of py"),
    ("a\tcmu\tchong2\n", "lexicon.tsv line 1: kind cmu but 'chong2' is written in pinyin"),
])
def test_a_bad_file_names_its_line(text, message):
    with pytest.raises(LexiconError, match=message):
        parse_file(text.encode())


def test_the_size_bound_is_a_413(tmp_path):
    path = tmp_path / "lexicon.tsv"
    path.write_bytes(render({str(i): make_entry(str(i), "sub", "x", "") for i in range(MAX_ENTRIES)}))
    store = LexiconStore(path)
    assert len(store.entries()) == MAX_ENTRIES
    with pytest.raises(PayloadTooLarge, match=f"holds {MAX_ENTRIES} entries"):
        store.put("one more", "sub", "x")
    store.put("0", "sub", "y")  # a change within the bound is fine
    n = (MAX_BYTES - len(render({}))) // len("w0000\tsub\t" + "x" * 499 + "\n")
    path.write_bytes(render({f"w{i:04}": Entry(f"w{i:04}", "sub", "x" * 499) for i in range(n)}))
    assert len(store.entries()) == n  # just under MAX_BYTES
    with pytest.raises(PayloadTooLarge, match="bytes; its limit"):
        store.put("w9999", "sub", "x" * 499)
