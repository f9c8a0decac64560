"""Serving word timings (issue 55, `--aligner`): worker processes load the aligner at start-up and send each
sentence's "end" mark with its words (both worker loops); a directory that does not load stops the start with
the reason (the flag check before any worker, and a worker that meets it); without an aligner, a request for
word timings is a 400 that names the field and the flag."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import ASSETS

from cosy.frontend.options import parse_args
from cosy.pipeline.request import SynthesisRequest
from cosy.service.process import EngineSpec
from cosy.service.workers import WorkerPool
from cosy.verify.random_model import write_random_model

pytestmark = pytest.mark.quick

PROMPT = str(ASSETS / "cross_lingual_prompt.wav")
TEXT = "The day was good. And we went home."


@pytest.fixture(scope="module")
def aligner_dir(tmp_path_factory) -> Path:
    return write_random_model(tmp_path_factory.mktemp("aligner"), "tiny", family="mms-aligner")


@pytest.fixture()
def damaged_aligner_dir(aligner_dir, tmp_path) -> Path:
    d = tmp_path / "damaged"
    d.mkdir()
    for p in aligner_dir.iterdir():
        (d / p.name).write_bytes(p.read_bytes())
    config = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 3}))  # the weights have 2
    return d


@pytest.mark.parametrize("max_batch", [1, 2])  # the one-job loop and cosy.speech.worker's
def test_workers_send_each_sentences_words_with_its_end_mark(tiny_model_dir, aligner_dir, max_batch):
    spec = EngineSpec(str(tiny_model_dir), fixed_tokens=30, max_batch=max_batch, aligner=str(aligner_dir))
    pool = WorkerPool(spec, workers=1).start()
    try:
        req = SynthesisRequest(mode="cross_lingual", prompt_wav=PROMPT, text=TEXT,
                               seed=1, word_timestamps=True)
        marks: list = []
        audio = list(pool.synthesize(req, on_mark=marks.append))
        ends = [m.sentence for m in marks if m.kind == "end"]
        assert audio and ends
        for s in ends:
            assert s.words, s
            assert [w.text for w in s.words] == [t.strip(".") for t in s.text.split()]
            assert all(TEXT[w.begin_index:w.end_index] == w.text for w in s.words)
            assert all(s.begin_time <= w.begin_time <= w.end_time <= s.end_time for w in s.words)
        marks.clear()
        list(pool.synthesize(SynthesisRequest(**{**req.__dict__, "word_timestamps": False}), on_mark=marks.append))
        assert marks and not any(m.sentence.words for m in marks)
    finally:
        pool.close()


def test_a_worker_refuses_to_start_with_an_aligner_that_does_not_load(tiny_model_dir, damaged_aligner_dir):
    pool = WorkerPool(EngineSpec(str(tiny_model_dir), aligner=str(damaged_aligner_dir)), workers=1)
    with pytest.raises(RuntimeError, match="--aligner: AlignerLoadError: model.safetensors does not match "
                                           r"config.json \(missing: wav2vec2.encoder.layers.2") as e:
        pool.start()
    pool.close()
    assert "failed to start" in str(e.value)


def test_the_flag_is_checked_before_any_worker_starts(aligner_dir, damaged_aligner_dir, tmp_path, capsys):
    assert parse_args(["--aligner", str(aligner_dir)]).aligner == str(aligner_dir)
    assert parse_args([]).aligner is None
    for bad, reason in ((damaged_aligner_dir, "model.safetensors does not match config.json"),
                        (tmp_path / "absent", "is not a directory")):
        with pytest.raises(SystemExit):
            parse_args(["--aligner", str(bad)])
        err = capsys.readouterr().err
        assert f"--aligner {bad}: " in err and reason in err


def test_word_timings_without_an_aligner_are_a_400_naming_the_field_and_the_flag(tiny_model_dir, tmp_path):
    from cosy.deploy.data_dir import DataDir
    from cosy.frontend.service import FrontendService
    from cosy.pipeline.request import SynthesisError
    service = FrontendService(WorkerPool(EngineSpec(str(tiny_model_dir)), workers=1), DataDir(tmp_path))  # not started
    req = SynthesisRequest(mode="cross_lingual", prompt_wav=PROMPT, text=TEXT,
                           word_timestamps=True)
    with pytest.raises(SynthesisError) as e:
        service.resolve(req)
    assert e.value.status == 400
    assert "word_timestamp_enabled" in str(e.value) and "--aligner MODEL_DIR" in str(e.value)
    service.resolve(SynthesisRequest(**{**req.__dict__, "word_timestamps": False}))  # sentence timings only: served
