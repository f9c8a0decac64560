"""The two golden model directories (written by the official code, tests/fixtures) as engines, with the tiny
models' prompt encoders: the fixtures `cv2` and `cv3` ((Engine, Recorded), one each per test module), which
conftest.py offers every module."""
from __future__ import annotations

import shutil

import pytest
from conftest import ASSETS, FIXTURES
from worker_hooks import cap_lm

from cosy.pipeline.engine import Engine

PROMPT = ASSETS / "cross_lingual_prompt.wav"


class Recorded:
    """The engine's LM, capped at 30 tokens a call (three streaming chunks' worth is not needed here), keeping
    the tokens of each call."""

    def __init__(self, engine: Engine):
        cap_lm(engine, 30)
        self.calls: list[list[int]] = []
        generate = engine.lm.generate

        def recording(*args, **kw):
            tokens = []
            self.calls.append(tokens)
            for t in generate(*args, **kw):
                tokens.append(t)
                yield t
        engine.lm.generate = recording

    def take(self) -> list[list[int]]:
        calls, self.calls = self.calls, []
        return calls


def golden_engine(name: str, tiny, tmp_path_factory) -> tuple[Engine, Recorded]:
    md = tmp_path_factory.mktemp(name) / "model"
    shutil.copytree(FIXTURES / name / "model", md)
    for onnx in ("campplus.onnx", "speech_tokenizer_v2.onnx", "speech_tokenizer_v3.onnx"):
        if (tiny / onnx).exists():  # the golden models have no prompt encoders
            shutil.copy2(tiny / onnx, md / onnx)
    if name == "golden":  # its tokenizer lies beside the model (ids < 4096 fit its LM)
        for f in ("vocab.json", "merges.txt", "tokenizer_config.json"):
            shutil.copy2(FIXTURES / "golden" / "tokenizer" / f, md / "CosyVoice-BlankEN" / f)
    engine = Engine.from_model_dir(md)
    return engine, Recorded(engine)


@pytest.fixture(scope="module")
def cv2(tiny_model_dir, tmp_path_factory) -> tuple[Engine, Recorded]:
    return golden_engine("golden", tiny_model_dir, tmp_path_factory)


@pytest.fixture(scope="module")
def cv3(tiny_cv3_model_dir, tmp_path_factory) -> tuple[Engine, Recorded]:
    return golden_engine("golden-cv3", tiny_cv3_model_dir, tmp_path_factory)
