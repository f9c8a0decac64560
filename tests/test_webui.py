"""The WebUI in a real headless Chromium (Debian's /usr/bin/chromium driven by Playwright): every mode
makes playable audio, saving a voice works, bad input shows a readable message.

One app and one browser for the module; every test starts from a freshly loaded page, so each one sets
up what it needs and the tests pass in any order or alone."""
from __future__ import annotations

import re
import shutil
from pathlib import Path

import httpx
import pytest
from conftest import ASSETS
from playwright.sync_api import expect
from servers import App, metric

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
        "--disable-component-update", "--disable-sync",
        "--use-fake-device-for-media-stream", "--use-fake-ui-for-media-stream"]  # a beeping microphone
ARTIFACTS = Path(__file__).parent / "artifacts"
ZS_TEXT = "希望你以后能够做的比我还好呦。"
# fetch a link or player source and decode it the way the browser would play it
DECODE = """async (el) => { const r = await fetch(el.href || el.src); const buf = await r.arrayBuffer();
  const audio = await new AudioContext().decodeAudioData(buf.slice(0));
  return {status: r.status, bytes: buf.byteLength, seconds: audio.duration}; }"""
DOWNLOAD = "#download a[data-testid=download-link]"
# texts of the error and warning toasts on the page (not the info ones)
PROBLEMS = ("Array.from(document.querySelectorAll('[data-testid=toast-body]'))"
            ".map(t => t.innerText).filter(t => !t.startsWith('Info'))")

pytestmark = pytest.mark.skipif(not Path(CHROMIUM).exists() or not shutil.which("ffmpeg"),
                                reason="needs Debian's chromium and ffmpeg (apt-get install -y chromium ffmpeg)")


@pytest.fixture(scope="module")
def browser():
    """One Playwright driver and Chromium for the module: the sync API allows one driver per thread at a time."""
    from playwright.sync_api import sync_playwright
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        expect.set_options(timeout=30_000)
        yield b
        b.close()


@pytest.fixture(scope="module")
def session(browser, tiny_model_dir, tmp_path_factory):
    app = App("--model_dir", str(tiny_model_dir), "--data_dir", str(tmp_path_factory.mktemp("webui_data")))
    try:
        app.wait()
        context = browser.new_context(viewport={"width": 1280, "height": 1400}, permissions=["microphone"])
        pg = context.new_page()
        pg.set_default_timeout(90_000)
        yield pg, app.url
        context.close()
    finally:
        app.stop()


@pytest.fixture
def page(session):
    pg, url = session
    pg.goto(url, wait_until="networkidle")  # a new page load: no state from an earlier test
    return pg


def uploaded(response) -> bool:
    return "/gradio_api/upload" in response.url and response.ok


def screenshot(page, name: str) -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / name), full_page=True)


def upload_prompt(page, name: str) -> None:
    with page.expect_response(uploaded):  # Generate waits for no upload
        page.locator("#prompt_wav input[type=file]").set_input_files(str(ASSETS / name))


def choose_mode(page, label: str) -> None:
    page.locator("#mode label", has_text=label).click()
    expect(page.locator("#mode label", has_text=label).locator("input")).to_be_checked()


def generate(page) -> dict:
    """Click Generate, wait for a new result, and return what the browser decodes of it."""
    before = page.locator(DOWNLOAD).get_attribute("href") if page.locator(DOWNLOAD).count() else None
    page.locator("#generate").click()
    page.wait_for_function(f"([sel, before]) => {{ const a = document.querySelector(sel); "
                           f"return (a && a.href && a.href !== before) || ({PROBLEMS}).length; }}",
                           arg=[DOWNLOAD, before])
    problems = page.evaluate(PROBLEMS)
    assert not problems and page.locator("#status").inner_text().startswith("完成 Done"), problems
    player = page.locator("#result a[data-testid=download-link]").evaluate(DECODE)
    download = page.locator(DOWNLOAD).evaluate(DECODE)
    assert player == download and player["status"] == 200
    assert player["bytes"] > 1000 and player["seconds"] > 0.1
    return player


def test_zero_shot_with_streaming_playback(page, tiny_model_dir):
    # the header names what is served: family, model directory, LM checkpoint
    expect(page.locator("#header")).to_contain_text(f"CosyVoice2 ({tiny_model_dir.name}) · LM llm.pt")
    upload_prompt(page, "zero_shot_prompt.wav")
    page.locator("#prompt_text textarea").fill(ZS_TEXT)
    page.locator("#tts_text textarea").fill("你好。今天天气很好。")
    page.locator("#stream input").check()
    generate(page)
    # the streamed chunks play in this player (a media source fed as they arrive)
    page.wait_for_function("() => { const a = document.querySelector('#live audio[src]'); "
                           "return a && a.src.startsWith('blob:') && a.error === null && a.duration > 0; }")
    metrics = httpx.get(page.url.split("?")[0].rstrip("/") + "/metrics").text  # the WebUI counts as a surface
    assert metric(metrics, "cosy_syntheses_total", surface="webui", mode="zero_shot", outcome="ok") >= 1


def test_cross_lingual_from_the_example(page):
    page.get_by_text("cross_lingual_prompt.wav", exact=True).click()  # sets prompt, mode and text
    expect(page.locator("#mode label", has_text="跨语种复刻").locator("input")).to_be_checked()
    expect(page.locator("#prompt_text")).to_be_hidden()  # cross-lingual needs no transcript
    expect(page.locator("#tts_text textarea")).to_have_value(re.compile("荒诞故事"))  # before ours, not after
    page.locator("#tts_text textarea").fill("Hello, nice to meet you.")
    generate(page)


def test_ssml_checkbox_speaks_a_document_and_shows_its_errors(page):
    page.get_by_text("cross_lingual_prompt.wav", exact=True).click()
    # the example fills the text box when its event returns: fill after that, or it overwrites ours
    expect(page.locator("#tts_text textarea")).to_have_value(re.compile("荒诞故事"))
    page.locator("#tts_text textarea").fill('<speak>你好。<break time="2s"/>再见。</speak>')
    page.locator("#ssml input").check()
    assert generate(page)["seconds"] >= 2.0  # the break alone is 2 s of the audio
    page.locator("#tts_text textarea").fill("<speak>你好</speek>")
    page.locator("#generate").click()
    page.locator("[data-testid=toast-body]", has_text="SSML line 1, column").wait_for()
    assert "Traceback" not in page.content()


def test_instruct_with_an_example_instruction(page):
    choose_mode(page, "自然语言控制")
    upload_prompt(page, "cross_lingual_prompt.wav")
    page.get_by_text("用四川话说这句话", exact=True).click()  # the examples fill the instruction
    expect(page.locator("#instruct_text textarea")).to_have_value("用四川话说这句话")
    page.locator("#tts_text textarea").fill("你好。")
    generate(page)


def test_instruct_with_a_recorded_prompt(page):
    choose_mode(page, "自然语言控制")
    page.locator("#instruct_text textarea").fill("Speak slowly and softly.")
    page.locator("#tts_text textarea").fill("你好。")
    page.locator("#prompt_wav button[aria-label='Record audio']").click()
    page.locator("#prompt_wav button", has_text="Record").first.click()
    page.wait_for_timeout(3500)  # 3.5 s of the fake microphone
    with page.expect_response(uploaded):
        page.locator("#prompt_wav button", has_text="Stop").first.click()
    expect(page.locator("#prompt_wav")).to_contain_text(re.compile(r"0:0[3-6]"))  # the recording is the prompt now
    generate(page)


def test_save_voice_then_use_it(page):
    page.get_by_text("zero_shot_prompt.wav", exact=True).click()  # the zero-shot example: prompt + transcript
    expect(page.locator("#prompt_text textarea")).to_have_value(ZS_TEXT)
    expect(page.locator("#prompt_wav")).to_contain_text(re.compile(r"0:0[1-9]"))  # the example audio is loaded
    page.get_by_text("保存音色 Save this voice").click()
    page.locator("#new_voice_id textarea, #new_voice_id input").first.fill("webui-voice")
    page.locator("#save_voice").click()
    page.locator("#save_status", has_text="webui-voice").wait_for()
    choose_mode(page, "预设音色")
    expect(page.locator("#voice input")).to_have_value("webui-voice")
    page.locator("#tts_text textarea").fill("你好。")
    generate(page)
    screenshot(page, "webui.png")


def test_bad_input_shows_a_readable_message(page):
    page.locator("#generate").click()  # zero-shot without a prompt
    page.locator("[data-testid=toast-body]", has_text="needs a prompt audio").wait_for()
    upload_prompt(page, "zero_shot_prompt.wav")
    page.locator("#prompt_text textarea").fill(ZS_TEXT)
    page.locator("#tts_text textarea").fill("")
    page.locator("#generate").click()
    toast = page.locator("[data-testid=toast-body]", has_text="text is empty")
    toast.wait_for()
    page.locator("#status", has_text="出错 Error: text is empty").wait_for()
    assert "Traceback" not in page.content()
    page.get_by_text("保存音色 Save this voice").click()
    page.locator("#new_voice_id textarea, #new_voice_id input").first.fill("../../etc/passwd")
    page.locator("#save_voice").click()
    page.locator("[data-testid=toast-body]", has_text="invalid voice id").wait_for()
    page.locator("#save_status", has_text="出错 Error: invalid voice id").wait_for()
    assert "Traceback" not in page.content()
    screenshot(page, "webui-errors.png")


def test_cosyvoice3_page_streams_zero_shot_and_runs_an_instruct2_example(browser, tiny_cv3_model_dir, tmp_path):
    """The same page on a CosyVoice3 model (its own app and browser context): the header names the family, a streamed
    zero-shot plays, and the family's example instructions (instruct2, ending in <|endofprompt|>) work."""
    from cosy.model.families.cosyvoice3 import FAMILY as CV3
    app = App("--model_dir", str(tiny_cv3_model_dir), "--data_dir", str(tmp_path / "data"))
    try:
        app.wait()
        context = browser.new_context(viewport={"width": 1280, "height": 1400})
        try:
            pg = context.new_page()
            pg.set_default_timeout(90_000)
            pg.goto(app.url, wait_until="networkidle")
            expect(pg.locator("#header")).to_contain_text(f"CosyVoice3 ({tiny_cv3_model_dir.name}) · LM llm.pt")
            upload_prompt(pg, "zero_shot_prompt.wav")
            pg.locator("#prompt_text textarea").fill(ZS_TEXT)
            pg.locator("#tts_text textarea").fill("你好。")
            pg.locator("#stream input").check()
            generate(pg)
            choose_mode(pg, "自然语言控制")
            example = CV3.instruct_examples[0]
            pg.get_by_text(example, exact=True).click()
            expect(pg.locator("#instruct_text textarea")).to_have_value(example)
            pg.locator("#stream input").uncheck()
            generate(pg)
        finally:
            context.close()
    finally:
        app.stop()


def test_the_sentence_being_spoken_is_marked_and_subtitles_download(page):
    """Sentence timestamps on the page (issue 55): the text with the sentence the player is at marked, following
    playback and seeking, and SRT/VTT files of the sentences."""
    from test_timestamps_http import TWO
    choose_mode(page, "跨语种复刻")
    upload_prompt(page, "cross_lingual_prompt.wav")  # (an upload: the example's own test clicks the example)
    page.locator("#tts_text textarea").fill(TWO)
    seconds = generate(page)["seconds"]
    spans = page.locator("#spoken .cosy-sentence")
    expect(spans).to_have_count(2)
    assert page.locator("#spoken").inner_text() == TWO  # the text as typed, digits and all
    times = [(int(spans.nth(i).get_attribute("data-begin")), int(spans.nth(i).get_attribute("data-end")))
             for i in range(2)]
    assert times[0][0] == 0 and times[0][1] == times[1][0] and abs(times[1][1] / 1000 - seconds) < 0.01, times
    # playing: the first sentence is marked while the player is in it; seeking into the second moves the mark
    page.locator("#result button[aria-label=Play], #result button[aria-label=play]").first.click()
    expect(spans.nth(0)).to_have_class(re.compile("cosy-current"))
    expect(spans.nth(1)).not_to_have_class(re.compile("cosy-current"))
    waveform = page.locator("#result #waveform").bounding_box()  # a click on it seeks there
    at = (times[1][0] + 0.1 * (times[1][1] - times[1][0])) / times[1][1]
    page.mouse.click(waveform["x"] + waveform["width"] * at, waveform["y"] + waveform["height"] / 2)
    expect(spans.nth(1)).to_have_class(re.compile("cosy-current"))
    expect(spans.nth(0)).not_to_have_class(re.compile("cosy-current"))
    # the subtitles: an SRT and a VTT of the two sentences
    links = page.locator("#subtitles a")
    expect(links).to_have_count(2)
    files = {}
    for i in range(2):
        got = links.nth(i).evaluate("async (a) => { const r = await fetch(a.href); "
                                    "return {status: r.status, name: a.href.split('/').pop(), text: await r.text()}; }")
        assert got["status"] == 200
        files[got["name"].rsplit(".", 1)[-1]] = got["text"]
    assert set(files) == {"srt", "vtt"} and files["vtt"].startswith("WEBVTT")
    for text in files.values():
        assert text.count(" --> ") == 2 and "回家的路上" in text
    spans.nth(1).scroll_into_view_if_needed()
    screenshot(page, "webui-timestamps.png")
