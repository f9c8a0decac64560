"""`python -m cosy` (the single-utterance CLI), in process on the tiny models: a request refused after
synthesis started (`<phoneme>` on CosyVoice2, a pinyin syllable without a token on CosyVoice3) writes no
file and leaves an existing one as it was; a folder, format or full disk it cannot write is a message, not a
traceback."""
from __future__ import annotations

import pytest
import soundfile as sf
from conftest import ASSETS, small_disk

from cosy.__main__ import main

CL_WAV = ASSETS / "cross_lingual_prompt.wav"


def cli(model_dir, out, *args: str) -> list[str]:
    return ["--model_dir", str(model_dir), "--mode", "cross_lingual", "--prompt_wav", str(CL_WAV), "--seed", "1",
            "--out", str(out), *args]


@pytest.mark.parametrize("model, text, reason", [
    ("tiny_model_dir", '<speak>去<phoneme alphabet="py" ph="chong2">重</phoneme>。</speak>',
     "needs a model whose tokenizer has phoneme tokens"),
    ("tiny_cv3_model_dir", '<speak><phoneme alphabet="py" ph="liang5">两</phoneme>。</speak>',
     "phoneme 'liang5' has no phoneme token"),
])
def test_a_refused_request_writes_no_file(model, text, reason, request, tmp_path, capsys):
    model_dir = request.getfixturevalue(model)
    out = tmp_path / "out.wav"
    assert main(cli(model_dir, out, "--ssml", "--text", text)) == 2
    err = capsys.readouterr().err
    assert "error: " in err and reason in err and "Traceback" not in err, err[-2000:]
    assert list(tmp_path.iterdir()) == []  # no file, no temporary file
    out.write_bytes(b"an earlier result")  # stays as it was
    assert main(cli(model_dir, out, "--ssml", "--text", text)) == 2
    assert out.read_bytes() == b"an earlier result" and [p.name for p in tmp_path.iterdir()] == ["out.wav"]


def test_an_output_the_cli_cannot_write_is_a_message(tiny_model_dir, tmp_path, capsys):
    with pytest.raises(SystemExit) as e:  # a usage error, before the model loads
        main(cli(tiny_model_dir, tmp_path / "missing" / "out.wav", "--text", "你好。"))
    assert e.value.code == 2 and "folder" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        main(cli(tiny_model_dir, tmp_path / "out.mp3", "--text", "你好。"))
    err = capsys.readouterr().err
    assert e.value.code == 2 and "out.mp3" in err and ".wav" in err, err
    assert list(tmp_path.iterdir()) == []
    flac = tmp_path / "out.flac"  # what libsndfile writes as 16-bit PCM still works
    assert main(cli(tiny_model_dir, flac, "--text", "你好。")) == 0
    assert sf.info(str(flac)).format == "FLAC"


def test_a_full_disk_is_a_message_and_leaves_no_file(tiny_model_dir, tmp_path, capsys):
    with small_disk(tmp_path / "disk", "64k") as disk:
        assert main(cli(tiny_model_dir, disk / "out.wav", "--text", "你好。")) == 2  # 77 KB of audio
        err = capsys.readouterr().err
        assert "error: cannot write --out" in err and "No space left" in err and "Traceback" not in err, err
        assert list(disk.iterdir()) == []
