"""Audio encoders for the HTTP APIs: float32 mono chunks in, bytes of one audio file out, chunk by chunk.

    enc = make_encoder("mp3", 24000, streaming=True)   # one encoder per response
    for chunk in chunks:
        send(enc.encode(chunk))                        # bytes as soon as the codec has them
    send(enc.finish())                                 # the codec's tail; enc is closed

`pcm` is raw s16le mono. `wav` is a 44-byte header and s16le; streamed, its size fields are 0xFFFFFFFF
(unknown length, as OpenAI streams wav; libsndfile and ffmpeg read up to the end of the data). mp3 (LAME),
opus (in Ogg), aac (ADTS) and flac come from ffmpeg's encoders through PyAV. The concatenated bytes of a
response are always one valid file. Without `streaming` (or for flac, whose header must hold the sample
count), the file is written to memory and returned by `finish`, so its headers are exact.
"""
from __future__ import annotations

import io
import struct

import av
import numpy as np

from cosy.errors import BadRequest, echo

FORMATS = ("mp3", "opus", "aac", "flac", "wav", "pcm")
MEDIA_TYPES = {"mp3": "audio/mpeg", "opus": "audio/ogg", "aac": "audio/aac", "flac": "audio/flac",
               "wav": "audio/wav", "pcm": "audio/pcm"}
# format -> (ffmpeg container, encoder, default bit rate for mono speech)
_FFMPEG = {"mp3": ("mp3", "libmp3lame", 64000), "opus": ("ogg", "libopus", 32000),
           "aac": ("adts", "aac", 64000), "flac": ("flac", "flac", None)}
OPUS_RATES = (8000, 12000, 16000, 24000, 48000)
# A requested bit rate is what the codec aims at, capped at what it can do for mono at the sample rate:
# LAME and ffmpeg's aac cap it themselves (mp3: 160k at <= 24 kHz (MPEG-2), 320k at 32-48 kHz, at least
# 32k at 32-48 kHz; aac: about 6144 bit per 1024-sample frame), libopus refuses more than 256k for mono,
# so we cap opus here. So every published bit rate ("16k" ... "384k") works at every sample rate.
OPUS_MAX_BIT_RATE = 256000
_UNKNOWN = 0xFFFFFFFF


class EncodingError(BadRequest):
    """An output format, rate or bit rate the encoders cannot produce; the message says what is allowed."""


def to_s16le(audio: np.ndarray) -> bytes:
    """float32 in [-1, 1] -> little-endian int16 bytes (clipped: volume gains may overshoot)."""
    return (np.clip(audio, -1.0, 1.0) * 32767.0).round().astype("<i2").tobytes()


def wav_header(sample_rate: int, data_bytes: int | None) -> bytes:
    """RIFF/WAVE header for 16-bit mono PCM; `data_bytes` None writes the 'unknown length' sizes."""
    riff = _UNKNOWN if data_bytes is None else 36 + data_bytes
    data = _UNKNOWN if data_bytes is None else data_bytes
    return (b"RIFF" + struct.pack("<I", riff) + b"WAVEfmt " +
            struct.pack("<IHHIIHH", 16, 1, 1, sample_rate, sample_rate * 2, 2, 16) + b"data" + struct.pack("<I", data))


class AudioEncoder:
    """The interface: `encode` a chunk -> the bytes ready so far; `finish` -> the rest (call once)."""

    media_type = "application/octet-stream"

    def encode(self, audio: np.ndarray) -> bytes:
        raise NotImplementedError

    def finish(self) -> bytes:
        raise NotImplementedError

    def close(self) -> None:
        """Release resources without producing more output (a response that ended early)."""


class PcmEncoder(AudioEncoder):
    media_type = MEDIA_TYPES["pcm"]

    def encode(self, audio: np.ndarray) -> bytes:
        return to_s16le(audio)

    def finish(self) -> bytes:
        return b""


class WavEncoder(AudioEncoder):
    media_type = MEDIA_TYPES["wav"]

    def __init__(self, sample_rate: int, streaming: bool):
        self.rate, self.streaming = sample_rate, streaming
        self._header_sent = False
        self._held: list[bytes] = []  # not streaming: the data, until its length is known

    def encode(self, audio: np.ndarray) -> bytes:
        data = to_s16le(audio)
        if not self.streaming:
            self._held.append(data)
            return b""
        if self._header_sent:
            return data
        self._header_sent = True
        return wav_header(self.rate, None) + data

    def finish(self) -> bytes:
        if self.streaming:
            return b"" if self._header_sent else wav_header(self.rate, None)
        data = b"".join(self._held)
        self._held = []
        return wav_header(self.rate, len(data)) + data


class _Sink:
    """A write-only, unseekable file for the ffmpeg muxer: what it writes is taken out after each chunk."""

    def __init__(self):
        self.buf = bytearray()

    def write(self, data: bytes) -> int:
        self.buf += data
        return len(data)

    def take(self) -> bytes:
        out = bytes(self.buf)
        self.buf.clear()
        return out


class FFmpegEncoder(AudioEncoder):
    """mp3 / opus / aac / flac through PyAV. PyAV re-frames the chunks to the codec's frame size."""

    def __init__(self, fmt: str, sample_rate: int, bit_rate: int | None, streaming: bool):
        container_format, codec, default_rate = _FFMPEG[fmt]
        if fmt == "opus" and sample_rate not in OPUS_RATES:
            raise EncodingError(f"opus cannot be encoded at {sample_rate} Hz: use one of "
                                f"{', '.join(map(str, OPUS_RATES))}")
        self.media_type = MEDIA_TYPES[fmt]
        self.streaming = streaming and fmt != "flac"  # flac's STREAMINFO needs the total sample count
        self._out = _Sink() if self.streaming else io.BytesIO()
        # Ogg pages normally hold ~1 s; 20 ms pages let each chunk's audio leave at once
        options = {"page_duration": "20000"} if fmt == "opus" and self.streaming else {}
        self.rate, self._pts, self._closed = sample_rate, 0, False
        self._container = av.open(self._out, mode="w", format=container_format, options=options)
        try:
            self._stream = self._container.add_stream(codec, rate=sample_rate, layout="mono")
            if fmt != "flac" and (bit_rate or default_rate):
                rate = int(bit_rate or default_rate)
                self._stream.codec_context.bit_rate = min(rate, OPUS_MAX_BIT_RATE) if fmt == "opus" else rate
            self._stream.codec_context.open()  # now, so that bad settings fail before synthesis starts
        except (av.FFmpegError, ValueError) as e:
            self.close()
            raise EncodingError(f"cannot encode {fmt} at {sample_rate} Hz"
                                f"{f' and {bit_rate} bit/s' if bit_rate else ''}: {e}") from None

    def _mux(self, frame: av.AudioFrame | None) -> None:
        for packet in self._stream.encode(frame):
            self._container.mux(packet)

    def _take(self) -> bytes:
        return self._out.take() if self.streaming else b""

    def encode(self, audio: np.ndarray) -> bytes:
        if audio.size:
            samples = np.ascontiguousarray(np.clip(audio, -1.0, 1.0), dtype=np.float32)[None, :]
            frame = av.AudioFrame.from_ndarray(samples, format="flt", layout="mono")
            frame.sample_rate, frame.pts = self.rate, self._pts
            self._pts += samples.shape[1]
            self._mux(frame)
        return self._take()

    def finish(self) -> bytes:
        self._mux(None)  # drain the codec
        self._container.close()  # the muxer's trailer
        self._closed = True
        return self._out.take() if self.streaming else self._out.getvalue()

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            try:
                self._container.close()
            except (av.FFmpegError, ValueError, OSError):
                pass  # an aborted response: nothing more is sent anyway


def wav_bytes(audio: np.ndarray, sample_rate: int) -> bytes:
    """A whole 16-bit mono wav file in memory (the one wav writer: results, previews, stored prompts)."""
    enc = WavEncoder(sample_rate, streaming=False)
    enc.encode(audio)
    return enc.finish()


def make_encoder(fmt: str, sample_rate: int, *, bit_rate: int | None = None, streaming: bool = True) -> AudioEncoder:
    """An encoder for one response. EncodingError for an unknown format or settings the codec refuses."""
    if fmt not in FORMATS:
        raise EncodingError(f"unsupported output format {echo(fmt)}: use one of {', '.join(FORMATS)}")
    if fmt == "pcm":
        return PcmEncoder()
    if fmt == "wav":
        return WavEncoder(sample_rate, streaming)
    return FFmpegEncoder(fmt, sample_rate, bit_rate, streaming)
