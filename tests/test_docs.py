"""The documentation cannot drift from the code: the site builds offline in strict mode (a broken link, a
missing page or anchor fails), its generated reference lists every flag, route and api_name of the code, every
flag has a help text to list, and the hand-written pages (and the README) name only flags, routes and
api_names that exist."""
from __future__ import annotations

import html
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from docsgen import reference  # noqa: E402

PAGES = sorted((ROOT / "docs").rglob("*.md")) + [ROOT / "README.md"]
# which program a command line starts, by how users start it
COMMANDS = [
    (re.compile(r"(?:python3? |\.venv\S*/python |\S*/)?(?:-m cosy batch)\b|cosy batch\b"), "python -m cosy batch"),
    (re.compile(r"(?:python3? |\.venv\S*/python )-m cosy(?![\w.])|(?<![\w-])cosy (?=--)"), "python -m cosy"),
    (re.compile(r"(?:python3? |\.venv\S*/python )app\.py\b|cosy-frontend\b"), "python app.py"),
    (re.compile(r"(?:python3? |\.venv\S*/python )launch/backend\.py\b|cosy-backend\b"), "python launch/backend.py"),
]
# paths of the backend (vLLM) and of Gradio's own raw-call API, which the pages name for what they are
NOT_FRONTEND_ROUTES = {"/v1", "/v1/completions", "/v1/models"}
ROUTE_IN_TEXT = re.compile(r"(?<![\w.:/-])(/(?:api|api-ws|v1)(?:/[\w.{}$<>-]+)*)")


def _program(name: str) -> reference.Program:
    return next(p for p in reference.programs() if p.name == name)


def _every_flag() -> set[str]:
    flags = set()
    for p in reference.programs():
        flags |= reference.option_names(p)
    for script in (ROOT / "bench").glob("*.py"):  # the benchmarks' flags, which the tools page lists
        flags |= set(re.findall(r"add_argument\(\s*\"(--[\w-]+)\"", script.read_text()))
    return flags


def command_lines(text: str) -> list[str]:
    """Every shell command line of a page, continuation lines joined."""
    lines, out = text.split("\n"), []
    i = 0
    while i < len(lines):
        line = lines[i]
        while line.rstrip().endswith("\\") and i + 1 < len(lines):
            i += 1
            line = line.rstrip()[:-1] + " " + lines[i].strip()
        out.append(line)
        i += 1
    return out


def flags_named(line: str) -> list[tuple[str, str]]:
    """(program, flag) for each cosy command on a line and the flags written after it (up to `--`, a pipe,
    `&&`, `;` or the next command)."""
    found = []
    for pattern, program in COMMANDS:
        for m in pattern.finditer(line):
            rest = re.split(r"\s--\s|\s--$|\||&&|;|`|\)", line[m.end():])[0]
            rest = re.split(r"python3? |cosy-(?:frontend|backend)\b", rest)[0]
            found += [(program, f) for f in re.findall(r"(?<![\w-])(--[a-z][\w-]*)", rest)]
    seen, out = set(), []
    for item in found:  # `-m cosy batch` also matches `-m cosy`: the longer command wins
        if item[1] not in seen:
            seen.add(item[1])
            out.append(item)
    return out


def route_matches(path: str, routes: list[str]) -> bool:
    """`path` is a route (placeholders match any segment), or, ending in '/', the prefix of one."""
    if path.endswith("/") and any(r.startswith(path) for r in routes):
        return True
    for route in routes:
        pattern = "^" + re.sub(r"\\\{[^}]+\\\}", r"[^/]+", re.escape(route)) + "/?$"
        if re.match(pattern, path):
            return True
    return False


@pytest.mark.quick
def test_every_flag_has_help_and_the_reference_lists_it():
    from docsgen.pages import flags_page
    page = flags_page()
    for program in reference.programs():
        for action in program.flags():
            assert action.help, f"{program.name} {action.option_strings or action.dest}: a flag without a help " \
                                "text (the docs' reference is made from it)"
            for flag in action.option_strings:
                assert f"`{flag}`" in page, (program.name, flag)


@pytest.mark.quick
def test_the_pages_name_only_flags_that_exist():
    every = _every_flag()
    wrong = []
    for page in PAGES:
        text = page.read_text()
        for line in command_lines(text):
            for program, flag in flags_named(line):
                if flag not in reference.option_names(_program(program)):
                    wrong.append(f"{page.relative_to(ROOT)}: {program} has no {flag}: {line.strip()[:100]}")
        # a flag written alone in backticks: cosy's flags are snake_case, so one with an underscore is ours
        for flag in re.findall(r"`(--[a-z]\w*_\w+)", text):
            if flag not in every:
                wrong.append(f"{page.relative_to(ROOT)}: no program has {flag}")
    assert not wrong, "\n".join(wrong)


@pytest.mark.quick
def test_the_pages_name_only_routes_and_api_names_that_exist():
    routes = [r.path for r in reference.routes()]
    names = set(reference.gradio_endpoints())
    wrong = []
    for page in PAGES:
        text = page.read_text()
        for path in ROUTE_IN_TEXT.findall(text):
            path = path.rstrip(".")
            if path not in NOT_FRONTEND_ROUTES and not route_matches(path, routes):
                wrong.append(f"{page.relative_to(ROOT)}: no route {path}")
        for name in re.findall(r"api_name=[\"'](/\w+)", text) + re.findall(r"/gradio_api/call(/\w+)", text):
            if name not in names:
                wrong.append(f"{page.relative_to(ROOT)}: no gradio api_name {name}")
    assert not wrong, "\n".join(wrong)


def test_the_site_builds_offline_in_strict_mode(tmp_path):
    site = tmp_path / "site"
    env = {**os.environ, "DISABLE_MKDOCS_2_WARNING": "true", "NO_MKDOCS_2_WARNING": "1"}  # a banner, not ours
    r = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(site)], cwd=ROOT,
                       capture_output=True, text=True, timeout=600, env=env)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-6000:]
    flags = html.unescape((site / "reference" / "flags" / "index.html").read_text())
    for program in reference.programs():
        for flag in (s for a in program.flags() for s in a.option_strings):
            assert f"<code>{flag}</code>" in flags, (program.name, flag)
    routes = html.unescape((site / "reference" / "routes" / "index.html").read_text())
    for route in reference.routes():
        assert f"<code>{route.path}</code>" in routes, route
    gradio = html.unescape((site / "reference" / "gradio" / "index.html").read_text())
    for name, endpoint in reference.gradio_endpoints().items():
        assert f"<code>{name}</code>" in gradio, name
        for p in endpoint.parameters:
            assert f"<code>{p.name}</code>" in gradio, (name, p.name)
    metrics = html.unescape((site / "operations" / "metrics" / "index.html").read_text())
    for series in reference.metrics():
        assert f"<code>{series.name}</code>" in metrics, series.name
    performance = (site / "performance" / "index.html").read_text()
    for figure in re.findall(r'src="([^"]+\.png)"', performance):
        assert (site / "performance" / figure).is_file() or (site / figure.lstrip("./")).is_file(), figure


def _tour_blocks() -> list[tuple[str, str]]:
    """(language, code) of each code block of the README's tour, in order."""
    text = (ROOT / "README.md").read_text()
    tour = text[text.index("## A 30-second tour"):]
    tour = tour[:tour.index("\n## ", 5)]
    return re.findall(r"```(\w+)\n(.*?)```", tour, re.S)


def test_the_readme_tour_runs_as_written(tiny_model_dir, tmp_path):
    """The README's tour, block by block, against a real frontend on the tiny model: gradio_client saves a
    voice and speaks with it, curl gets an mp3 from the OpenAI route, the CLI writes a wav with the voice."""
    from servers import App
    data = tmp_path / "data"
    app = App("--model_dir", str(tiny_model_dir), "--data_dir", str(data)).wait()
    try:
        blocks = _tour_blocks()
        assert [lang for lang, _ in blocks] == ["python", "bash", "bash"], blocks

        def local(code: str) -> str:
            return (code.replace("http://localhost:50000/", app.url).replace("models/tiny", str(tiny_model_dir))
                    .replace("--data_dir data", f"--data_dir {data}").replace(".venv/bin/python", sys.executable)
                    .replace('"assets/', f'"{ROOT}/assets/'))

        python = subprocess.run([sys.executable, "-c", local(blocks[0][1])], cwd=tmp_path, capture_output=True,
                                text=True, timeout=300)
        assert python.returncode == 0, python.stderr[-3000:]
        wav = Path(python.stdout.strip().splitlines()[-1])
        assert wav.suffix == ".wav" and wav.stat().st_size > 44, python.stdout
        for lang, code in blocks[1:]:
            r = subprocess.run(["bash", "-euo", "pipefail", "-c", local(code)], cwd=tmp_path, capture_output=True,
                               text=True, timeout=300)
            assert r.returncode == 0, (code, r.stdout[-2000:], r.stderr[-3000:])
        assert (tmp_path / "hello.mp3").read_bytes()[:3] in (b"ID3", b"\xff\xfb", b"\xff\xf3", b"\xff\xf2")
        import soundfile as sf
        audio, rate = sf.read(tmp_path / "hello.wav")
        assert rate == 24000 and len(audio) > 0
    finally:
        app.stop()


@pytest.mark.quick
def test_the_websocket_message_lists_are_the_ones_the_code_reads_and_sends():
    """The reference's message lists (`ws_tasks.CLIENT_ACTIONS` ...) against the literals the sessions use."""
    from cosy.frontend import ws_openai, ws_tasks
    tasks = (ROOT / "cosy" / "frontend" / "ws_tasks.py").read_text()
    assert set(re.findall(r"event\(\"([a-z-]+)\"", tasks)) | {"task-failed"} == set(ws_tasks.SERVER_EVENTS)
    assert set(re.findall(r"action (?:==|in) \(?\"([a-z-]+)\"", tasks)) | set(
        re.findall(r"\"((?:run|continue|finish)-task)\"", tasks)) == set(ws_tasks.CLIENT_ACTIONS)
    session = (ROOT / "cosy" / "frontend" / "ws_openai.py").read_text()
    assert set(re.findall(r"json\.dumps\(\{\"type\": \"([a-z._]+)\"", session)) == set(ws_openai.SERVER_TYPES)
    read = {t for pair in re.findall(r"kind (?:==|in) \(?\"([a-z._]+)\"(?:, \"([a-z._]+)\")?", session)
            for t in pair if t}
    assert read == set(ws_openai.CLIENT_TYPES)


@pytest.mark.quick
def test_the_readmes_links_point_at_files_that_exist():
    text = (ROOT / "README.md").read_text()
    links = [link for link in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text) if "://" not in link]
    assert links, "the README's table of where to go next"
    missing = [link for link in links if not (ROOT / link).exists()]
    assert not missing, missing
    assert len(text.splitlines()) <= 200, "the front door stays short: details go into docs/"
