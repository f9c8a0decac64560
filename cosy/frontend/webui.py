"""The WebUI: one page for every mode (saved voice, 3 s clone, cross-lingual, instruct), bilingual labels.

The prompt comes from an upload or the microphone; results stream into a player while they are made (or
arrive whole), and stay playable and downloadable as a wav. Every failure shows as a readable message.
While a player plays, the text below it marks the sentence being spoken (its timings: `cosy.pipeline.timing`);
the sentences are also offered as SRT and VTT subtitles.
"""
from __future__ import annotations

import html
import random
import shutil
import time
from pathlib import Path

import gradio as gr
import numpy as np

from cosy.errors import BadRequest
from cosy.frontend.encoding import wav_bytes
from cosy.frontend.gradio_api import (
    SUBTITLE_FORMATS,
    indexed_text,
    refused_uploads_removed,
    stored_upload,
    subtitle_file,
    user_errors,
    wav_file,
)
from cosy.frontend.service import FrontendService
from cosy.pipeline.request import SPEED_RANGE, SynthesisRequest, as_number
from cosy.pipeline.timing import SentenceMark, SentenceTiming

ASSETS = Path(__file__).resolve().parents[2] / "assets"
# the served modes (cosy.pipeline.request.SERVED_MODES), in the order the page offers them
MODE_LABELS = {"voice": "预设音色 Saved voice", "zero_shot": "3s极速复刻 Zero-shot clone",
               "cross_lingual": "跨语种复刻 Cross-lingual", "instruct": "自然语言控制 Instruct"}
HELP = {
    "voice": "选择一个已保存的音色。 Pick a voice saved earlier (see *保存音色 Save this voice* below).",
    "zero_shot": "上传或录制 3-30 秒的 prompt 音频，并填写它的文本。 Upload or record a 3-30 s prompt and "
                 "type what it says.",
    "cross_lingual": "上传或录制 prompt 音频（任何语言，无需文本）；合成文本可用另一种语言。 Upload or record a "
                     "prompt in any language (no transcript needed); the text may be in another language.",
    "instruct": "上传或录制 prompt 音频，并用一句话描述说话方式。 Upload or record a prompt and describe how "
                "to speak.",
}
THEME = gr.themes.Soft(font=["ui-sans-serif", "system-ui", "sans-serif"],  # no web fonts: works offline
                       font_mono=["ui-monospace", "monospace"])
PRIVATE = dict(api_visibility="private")  # UI events stay out of the documented API (gradio_api.py)
# Marks the sentence being spoken while a player (#result, or #live while it streams) plays, comparing its time
# with each sentence's data-begin/data-end (ms; an empty end: still being spoken). The result player's audio
# element lives in its waveform's shadow DOM, whose media events never reach the document: each element that
# starts playing gets the listeners itself (and its owner is found across shadow roots)
HIGHLIGHT_JS = """
if (!window.cosySpokenHooked) {
  window.cosySpokenHooked = true;
  const owner = (el) => {
    for (let n = el; n; n = n.parentElement || (n.getRootNode() && n.getRootNode().host)) {
      if (n.id === 'result' || n.id === 'live') return n;
    }
    return null;
  };
  const mark = (e) => {
    const player = e.target;
    if (!owner(player)) return;
    const ms = player.currentTime * 1000;
    for (const s of document.querySelectorAll('#spoken .cosy-sentence')) {
      const end = s.dataset.end === '' ? Infinity : Number(s.dataset.end);
      s.classList.toggle('cosy-current', ms >= Number(s.dataset.begin) && ms < end && !player.ended);
    }
  };
  const kinds = ['timeupdate', 'seeked', 'ended'];
  const play = HTMLMediaElement.prototype.play;
  HTMLMediaElement.prototype.play = function (...args) {
    if (!this.cosyWatched) {
      this.cosyWatched = true;
      for (const kind of kinds) this.addEventListener(kind, mark);
    }
    return play.apply(this, args);
  };
  for (const kind of kinds) document.addEventListener(kind, (e) => e.target.cosyWatched || mark(e), true);
}
"""
HIGHLIGHT_CSS = ".cosy-current { background: #fde68a; color: #111; border-radius: 3px; }"


def _voice_ids(service: FrontendService) -> list[str]:
    try:
        return [v["voice_id"] for v in service.list_voices()]
    except Exception:  # an unreadable data dir must not break the page
        return []


def _request(service: FrontendService, mode: str, text: str, prompt_wav: str | None, prompt_text: str,
             instruct_text: str, voice_id: str | None, seed: float | None, speed: float,
             stream: bool, track=None, ssml: bool = False) -> SynthesisRequest:
    """The request for the UI's current values (only the fields the mode uses)."""
    req = SynthesisRequest(mode=mode, text=text, seed=as_number(seed, "seed", int), speed=as_number(speed, "speed"),
                           stream=stream, ssml=ssml)
    if mode == "voice":
        req.voice_id = voice_id
        return req
    req.prompt_wav = stored_upload(service, prompt_wav, track=track)
    if mode == "zero_shot":
        req.prompt_text = prompt_text
    elif mode == "instruct":
        req.instruct_text = instruct_text
    return req


def spoken_html(text: str, sentences: list[SentenceTiming]) -> str:
    """`text` with each sentence's span (begin_index:end_index) in a span holding its times (ms), for
    HIGHLIGHT_JS; a sentence still being spoken has an empty data-end."""
    parts, at = [], 0
    for s in sorted(sentences, key=lambda s: s.begin_index):
        begin = max(at, s.begin_index)
        end = "" if s.end_time is None else s.end_time
        parts.append(html.escape(text[at:begin]))
        parts.append(f'<span class="cosy-sentence" data-index="{s.index}" data-begin="{s.begin_time}" '
                     f'data-end="{end}">{html.escape(text[begin:s.end_index])}</span>')
        at = max(at, s.end_index)
    parts.append(html.escape(text[at:]))
    return f'<div class="cosy-spoken" style="white-space: pre-wrap">{"".join(parts)}</div>'


def _generate(service: FrontendService):
    def generate(mode, text, prompt_wav, prompt_text, instruct_text, voice_id, seed, speed, stream, ssml=False,
                 progress=gr.Progress()):
        """Yield (streaming player, result, download, status, spoken text, subtitles) as audio is made."""
        start, chunks, made = time.monotonic(), [], 0.0
        sr = service.sample_rate
        sentences: dict[int, SentenceTiming] = {}  # by index: the latest mark of each
        marks: list[SentenceMark] = []  # since the last yield

        yield gr.skip(), gr.skip(), gr.skip(), "合成中 Synthesizing…", "", None
        try:
            with user_errors(), refused_uploads_removed() as track:
                req = _request(service, mode, text, prompt_wav, prompt_text, instruct_text, voice_id, seed, speed,
                               bool(stream), track, bool(ssml))
                shown = indexed_text(req)
                progress((0, None), desc="合成中 Synthesizing")
                for chunk in service.stream(req, "webui", on_sentence=marks.append):
                    chunks.append(chunk)
                    made += len(chunk) / sr
                    status = f"合成中… {made:.1f} s 音频 / Synthesizing… {made:.1f} s of audio so far"
                    progress((len(chunks), None), desc="合成中 Synthesizing", unit="chunks" if stream else "parts")
                    sentences.update((m.sentence.index, m.sentence) for m in marks)
                    spoken = spoken_html(shown, list(sentences.values())) if marks and stream else gr.skip()
                    marks.clear()
                    yield (wav_bytes(chunk, sr) if stream else gr.skip()), gr.skip(), gr.skip(), status, spoken, \
                        gr.skip()
                if not chunks:
                    raise BadRequest("nothing was synthesized; check the text")
                sentences.update((m.sentence.index, m.sentence) for m in marks)
                done = [sentences[i] for i in sorted(sentences)]
                path = wav_file(np.concatenate(chunks), sr, f"cosy-{mode}")
                subtitles = [subtitle_file(done, fmt, f"cosy-{mode}") for fmt in SUBTITLE_FORMATS]
        except gr.Error as e:
            yield gr.skip(), gr.skip(), gr.skip(), f"出错 Error: {e.message}", gr.skip(), gr.skip()  # and a toast
            raise
        took = time.monotonic() - start
        yield (gr.skip(), path, path, f"完成 Done: {made:.1f} s 音频 / of audio in {took:.1f} s",
               spoken_html(shown, done), subtitles)

    return generate


def _save_voice(service: FrontendService):
    def save(voice_id, prompt_text, prompt_wav):
        yield gr.skip(), "保存中 Saving…"
        try:
            with user_errors(), refused_uploads_removed() as track:
                v = service.save_voice((voice_id or "").strip(), prompt_text,
                                       stored_upload(service, prompt_wav, track=track))
        except gr.Error as e:
            yield gr.skip(), f"出错 Error: {e.message}"
            raise
        gr.Info(f"已保存音色 Saved voice '{v['voice_id']}'")
        yield gr.update(choices=_voice_ids(service), value=v["voice_id"]), f"已保存 Saved: {v['voice_id']}"

    return save


def _on_mode(mode: str):
    """Show the inputs the mode uses."""
    return (gr.update(visible=mode != "voice"), gr.update(visible=mode == "zero_shot"),
            gr.update(visible=mode == "instruct"), gr.update(visible=mode == "voice"), HELP[mode])


def build(service: FrontendService, title: str | None = None) -> gr.Blocks:
    """The WebUI Blocks (the API endpoints are added by the caller, see `gradio_api.register`); the header names
    the family, model directory and LM checkpoint served."""
    family = service.family
    title = title or f"{family.display_name} 语音合成 · Text to speech"
    can_stream = shutil.which("ffmpeg") is not None  # gradio encodes the streamed audio with ffmpeg
    with gr.Blocks(title=f"cosy · {family.display_name}", delete_cache=(600, 3600)) as blocks:
        gr.Markdown(f"# {title}\n{service.model_label} · cosy. 24 kHz; 相同种子与输入得到相同音频 / the same seed "
                    "and inputs give the same audio.", elem_id="header")
        mode = gr.Radio([(label, m) for m, label in MODE_LABELS.items()], value="zero_shot", label="推理模式 Mode",
                        elem_id="mode")
        mode_help = gr.Markdown(HELP["zero_shot"])
        text = gr.Textbox(label="合成文本 Text to speak", lines=3, elem_id="tts_text",
                          value="收到好友从远方寄来的生日礼物，那份意外的惊喜让我心中充满了甜蜜的快乐。")
        with gr.Row():
            with gr.Column() as prompt_col:
                prompt_wav = gr.Audio(sources=["upload", "microphone"], type="filepath", elem_id="prompt_wav",
                                      label="prompt音频 Prompt audio (上传或录音 upload or record, 3-30 s)")
                prompt_text = gr.Textbox(label="prompt文本 Prompt transcript", elem_id="prompt_text",
                                         placeholder="prompt音频说的内容 What the prompt audio says")
            with gr.Column():
                with gr.Row(visible=False) as voice_row:
                    voice = gr.Dropdown(_voice_ids(service), label="预设音色 Saved voice", elem_id="voice",
                                        interactive=True, scale=4)
                    refresh = gr.Button("🔄 刷新 Refresh", elem_id="refresh", scale=0, min_width=120)
                with gr.Group(visible=False) as instruct_box:
                    instruct = gr.Textbox(label="指令文本 Instruction", elem_id="instruct_text",
                                          placeholder=f"例如 e.g. {family.instruct_examples[0]}")
                    gr.Examples([[e] for e in family.instruct_examples], inputs=instruct,
                                label="指令示例 Example instructions")
                with gr.Row():
                    seed = gr.Number(value=0, precision=0, label="随机种子 Seed", elem_id="seed", scale=4)
                    dice = gr.Button("🎲", elem_id="dice", scale=0, min_width=60)
                speed = gr.Slider(*SPEED_RANGE, value=1.0, step=0.05, label="语速 Speed", elem_id="speed")
                stream = gr.Checkbox(False, label="流式合成 Streaming" + ("" if can_stream else
                                     " (needs ffmpeg on the server)"), interactive=can_stream, elem_id="stream")
                ssml = gr.Checkbox(False, label="SSML 标记 (<speak>, <break>, <sub>, <say-as>, <phoneme>)",
                                   elem_id="ssml")
        go = gr.Button("生成音频 Generate", variant="primary", elem_id="generate")
        status = gr.Markdown(elem_id="status")
        with gr.Row():
            live = gr.Audio(streaming=True, autoplay=True, interactive=False, visible=False, elem_id="live",
                            label="流式播放 Streaming playback")
            result = gr.Audio(type="filepath", interactive=False, label="合成结果 Result", elem_id="result")
            download = gr.File(label="下载 Download (wav)", interactive=False, elem_id="download")
            subtitles = gr.File(label="字幕 Subtitles (SRT, VTT)", interactive=False, elem_id="subtitles",
                                file_count="multiple")
        spoken = gr.HTML("", elem_id="spoken", css_template=HIGHLIGHT_CSS, js_on_load=HIGHLIGHT_JS)
        with gr.Accordion("保存音色 Save this voice (当前 prompt 音频与文本 the current prompt and transcript)",
                          open=False):
            with gr.Row():
                new_id = gr.Textbox(label="音色名 Voice id", elem_id="new_voice_id", scale=4,
                                    placeholder="letters, digits, _ - .")
                save = gr.Button("保存 Save", elem_id="save_voice", scale=0, min_width=120)
            save_status = gr.Markdown(elem_id="save_status")
        examples = [[str(ASSETS / "zero_shot_prompt.wav"), "希望你以后能够做的比我还好呦。", "zero_shot",
                     "收到好友从远方寄来的生日礼物，那份意外的惊喜让我心中充满了甜蜜的快乐。"],
                    [str(ASSETS / "cross_lingual_prompt.wav"), "", "cross_lingual",
                     "在他讲述那个荒诞故事的过程中，他突然停下来，因为他自己也被逗笑了。"]]
        if all(Path(e[0]).is_file() for e in examples):  # assets ship with the repo, not the wheel
            gr.Examples(examples, inputs=[prompt_wav, prompt_text, mode, text], label="示例 Examples")

        mode.change(_on_mode, mode, [prompt_col, prompt_text, instruct_box, voice_row, mode_help], **PRIVATE)
        stream.change(lambda s: gr.update(visible=bool(s)), stream, live, **PRIVATE)
        dice.click(lambda: random.randint(1, 100_000_000), None, seed, queue=False, **PRIVATE)
        refresh.click(lambda v: gr.update(choices=(ids := _voice_ids(service)), value=v if v in ids else None),
                      voice, voice, queue=False, **PRIVATE)
        blocks.load(lambda: gr.update(choices=_voice_ids(service)), None, voice, queue=False, **PRIVATE)
        go.click(_generate(service), [mode, text, prompt_wav, prompt_text, instruct, voice, seed, speed, stream, ssml],
                 [live, result, download, status, spoken, subtitles], **PRIVATE)
        save.click(_save_voice(service), [new_id, prompt_text, prompt_wav], [voice, save_status], **PRIVATE)
    return blocks
