"""The real `dashscope` SDK's SpeechSynthesizer pointed at one of our frontends: one streaming task, what came back."""
from __future__ import annotations

import json
from dataclasses import dataclass, field


@dataclass
class Task:
    """What the SDK's callback was given for one task."""

    audio: bytearray = field(default_factory=bytearray)
    events: list[dict] = field(default_factory=list)
    completed: bool = False
    error: str | None = None
    first_package_delay: float = 0.0  # the SDK's own measure (ms)

    def outputs(self, kind: str | None = None) -> list[dict]:
        """The events' payload outputs, of one `type` ("sentence-end" ...) or all."""
        out = [e["payload"]["output"] for e in self.events]
        return [o for o in out if kind is None or o["type"] == kind]


def dashscope_task(ws_base: str, key: str, pieces: list[str], timeout_ms: int = 300_000, **synth) -> Task:
    """Send `pieces` as one task through the SDK (`ws_base`: our frontend's ws:// URL of the DashScope route;
    `synth`: SpeechSynthesizer's arguments: voice, additional_params, language_hints ...). Errors the SDK raises
    propagate; one it only reports to the callback is in `Task.error`."""
    import dashscope
    from dashscope.audio.tts_v2 import AudioFormat, ResultCallback, SpeechSynthesizer

    task = Task()

    class Callback(ResultCallback):
        def on_data(self, data: bytes) -> None:
            task.audio.extend(data)

        def on_event(self, message: str) -> None:
            task.events.append(json.loads(message))

        def on_complete(self) -> None:
            task.completed = True

        def on_error(self, message) -> None:
            task.error = str(message)

    dashscope.base_websocket_api_url = ws_base
    dashscope.api_key = key
    synth = SpeechSynthesizer(model="cosyvoice-v2", **{"format": AudioFormat.PCM_24000HZ_MONO_16BIT, **synth},
                              callback=Callback())
    for piece in pieces:
        synth.streaming_call(piece)
    synth.streaming_complete(complete_timeout_millis=timeout_ms)
    task.first_package_delay = synth.get_first_package_delay()
    return task
