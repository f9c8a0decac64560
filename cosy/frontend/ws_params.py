"""The run-task parameters of the WebSocket task protocol (`cosy.frontend.ws_tasks`), per dialect.

PAI (`/api-ws/v1/audio/speech`), as its HTTP speech API (`cosy.frontend.pai_api`): mode
(fast_replication | cross_lingual_replication | natural_language_replication), reference_audio_id, instruct,
output_format (wav), sample_rate (24000), bit_rate ("192k"), volume (1.0), speed (1.0), debug, seed, enable_ssml,
priority (interactive by default; `cosy.frontend.service.FrontendService.priority_of`); and ours:
`binary_audio` (false: base64 in result-generated; true: each piece of audio as a binary frame, then its
result-generated without audio).
DashScope (`/api-ws/v1/inference`, its SDK's SpeechSynthesizer): voice (a reference audio / saved voice id;
spoken with its stored transcript, PAI's fast_replication), format (mp3), sample_rate (22050), volume
0-100 (50 = unchanged), rate 0.5-2 (speed), seed, enable_ssml, priority, hot_fix (both dialects: pronunciation
fixes, `cosy.text.lexicon.parse_hot_fix`); audio always as binary frames.
Other keys (pitch, text_type, type, bit_rate) are ignored; format "Default" and sample_rate 0 (the SDK's
AudioFormat.DEFAULT) mean mp3 at 22050 Hz.
Both: `word_timestamp_enabled` (the managed CosyVoice WebSocket's name: sentence timings with each sentence's
words, which need the frontend's --aligner) and `sentence_timestamp_enabled` (the sentence timings alone; the
managed service publishes no sentence switch: the name follows DashScope's `*_timestamp_enabled`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from cosy.errors import BadRequest
from cosy.frontend.encoding import FORMATS
from cosy.frontend.pai_api import DEFAULT_BIT_RATE, MODES, PaiOptions, parse_bit_rate
from cosy.frontend.speech_stream import SpeechRequest
from cosy.frontend.text_params import TextControls, language_of
from cosy.pipeline.request import PRIORITIES, SAMPLE_RATE_RANGE, SEED_RANGE, SPEED_RANGE, SynthesisRequest
from cosy.text.lexicon import parse_hot_fix


@dataclass
class TaskParams:
    speech: SpeechRequest
    binary: bool  # audio as binary frames
    ssml: bool = False  # enable_ssml: the text is one SSML document, in one continue-task (as published)
    # DashScope: its SDK's call() sets enable_ssml on every call, plain text included: text that is not
    # <speak>...</speak> is then spoken as plain text (elsewhere enable_ssml with plain text is a 400)
    plain_ok: bool = False
    # sentence timings asked for (sentence_timestamp_enabled or word_timestamp_enabled): None not asked, else
    # whether each sentence carries its words (`cosy.frontend.ws_tasks`: the sentence events)
    timestamps: bool | None = None


class TimestampParameters(BaseModel):
    """The timing switches of both task dialects (docs/api/timestamps.md)."""

    sentence_timestamp_enabled: bool | None = None  # an extension: each sentence's timings
    word_timestamp_enabled: bool | None = None  # the managed service's name: with each sentence's words

    def timestamps(self) -> bool | None:
        if not (self.sentence_timestamp_enabled or self.word_timestamp_enabled):
            return None
        return bool(self.word_timestamp_enabled)


class PaiTaskParameters(TimestampParameters, PaiOptions):
    mode: Literal["fast_replication", "cross_lingual_replication", "natural_language_replication"]
    reference_audio_id: str = Field(min_length=1)
    instruct: str = ""
    binary_audio: bool = False


class DashScopeParameters(TimestampParameters, TextControls):
    model_config = ConfigDict(extra="ignore")
    voice: str = Field(min_length=1)
    format: Literal[FORMATS + ("Default", "default")] = "mp3"  # the SDK's AudioFormat.DEFAULT sends "Default"
    sample_rate: int = Field(22050, description="0 (the SDK's default): 22050")
    volume: int = Field(50, ge=0, le=100)
    rate: float = Field(1.0, ge=SPEED_RANGE[0], le=SPEED_RANGE[1])
    seed: int | None = Field(None, ge=SEED_RANGE[0], le=SEED_RANGE[1])
    enable_ssml: bool = False
    priority: Literal[PRIORITIES] | None = None  # an extension, as on the PAI socket
    hot_fix: dict | None = None  # pronunciation fixes, as published (`cosy.text.lexicon.parse_hot_fix`)


def _validated(model: type[BaseModel], payload: dict, prefix: str = "parameters.") -> BaseModel:
    params = payload.get("parameters")
    if not isinstance(params, dict):
        raise BadRequest("run-task needs payload.parameters (an object)")
    try:
        return model.model_validate(params)
    except ValidationError as e:
        err = e.errors()[0]
        where = ".".join(str(x) for x in err["loc"])
        raise BadRequest(f"{prefix}{where}: {err['msg']}") from None


class Dialect:
    name = "pai"
    sentence_events = False  # result-generated events without audio (sentence-begin/-end) for its clients

    def parse(self, payload: dict) -> TaskParams:
        p = _validated(PaiTaskParameters, payload)
        mode = MODES[p.mode]
        if mode == "instruct" and not p.instruct.strip():
            raise BadRequest("parameters.instruct is required for natural_language_replication")
        synthesis = SynthesisRequest(mode=mode, voice_id=p.reference_audio_id, instruct_text=p.instruct,
                                     speed=p.speed or 1.0, seed=p.seed, stream=True, duplex=True,
                                     priority=p.priority, hot_fix=parse_hot_fix(p.hot_fix, "parameters.hot_fix"),
                                     word_timestamps=bool(p.timestamps()),
                                     language=language_of(p, "parameters."), markdown=bool(p.enable_markdown_filter))
        speech = SpeechRequest(synthesis, "pai", fmt=p.output_format or "wav", sample_rate=p.sample_rate or 24000,
                               bit_rate=parse_bit_rate(p.bit_rate or DEFAULT_BIT_RATE),
                               volume=1.0 if p.volume is None else p.volume)
        return TaskParams(speech, p.binary_audio, bool(p.enable_ssml), timestamps=p.timestamps())


class DashScopeDialect(Dialect):
    name = "dashscope"
    sentence_events = True

    def parse(self, payload: dict) -> TaskParams:
        p = _validated(DashScopeParameters, payload)
        fmt = "mp3" if p.format.lower() == "default" else p.format
        rate = p.sample_rate or 22050
        if not SAMPLE_RATE_RANGE[0] <= rate <= SAMPLE_RATE_RANGE[1]:
            raise BadRequest(f"parameters.sample_rate {rate} is out of range ({SAMPLE_RATE_RANGE[0]} to "
                             f"{SAMPLE_RATE_RANGE[1]})")
        synthesis = SynthesisRequest(mode="voice", voice_id=p.voice, speed=p.rate, seed=p.seed, stream=True,
                                     duplex=True, priority=p.priority,
                                     hot_fix=parse_hot_fix(p.hot_fix, "parameters.hot_fix"),
                                     word_timestamps=bool(p.timestamps()),
                                     language=language_of(p, "parameters."), markdown=bool(p.enable_markdown_filter))
        return TaskParams(SpeechRequest(synthesis, "pai", fmt=fmt, sample_rate=rate,
                                        volume=p.volume / 50), True, p.enable_ssml, plain_ok=True,
                          timestamps=p.timestamps())


__all__ = ["DashScopeDialect", "Dialect", "TaskParams"]
