"""The site's generated pages (run by mkdocs-gen-files at every build, see mkdocs.yml):

- reference/flags.md, reference/routes.md, reference/gradio.md from the code (`docsgen.reference`);
- the performance page's figures and tables, drawn from the benchmarks' JSON in docs/performance/ (each file
  one run, with the machine, date and commit it was measured on), appended to docs/performance.md.
"""
from __future__ import annotations

import argparse
import ast
import io
import json
import sys
from pathlib import Path

import mkdocs_gen_files

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from docsgen import reference  # noqa: E402

DATA = ROOT / "docs" / "performance"


def _cell(text: object) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _default(action: argparse.Action) -> str:
    if action.required:
        return "required"
    if isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction)):
        return "off" if isinstance(action, argparse._StoreTrueAction) else "on"
    if action.default in (None, argparse.SUPPRESS):
        return "none"
    return f"`{action.default}`"


def anchor(program: reference.Program) -> str:
    return program.name.replace("python ", "").replace(" -m ", "").replace("/", "-").replace(".py", "") \
        .replace(" ", "-").replace("_", "-")


def flags_page() -> str:
    out = ["# Flags", "",
           "Every flag of every cosy command, generated from the commands' own parsers at each build of this "
           "site (so it cannot fall behind them). `--help` on a command prints the same.", ""]
    for program in reference.programs():
        out += [f"## `{program.name}` {{#{anchor(program)}}}", "", program.summary, ""]
        if program.inherits:
            target = next(p for p in reference.programs() if p.name == program.inherits)
            out += [f"It also takes every flag of [`{program.inherits}`](#{anchor(target)}) that concerns "
                    "synthesis (the ones that concern serving are accepted and unused).", ""]
        out += ["| flag | default | meaning |", "| --- | --- | --- |"]
        for a in program.flags():
            name = ", ".join(f"`{s}`" for s in a.option_strings) or f"`{a.dest.upper()}` (positional)"
            if a.choices:
                name += " " + "\\|".join(f"`{c}`" for c in a.choices)
            help_text = (a.help or "").replace("%%", "%")  # argparse's escape; our helps are f-strings
            out.append(f"| {name} | {_cell(_default(a))} | {_cell(help_text)} |")
        out.append("")
    return "\n".join(out)


def routes_page() -> str:
    out = ["# HTTP routes and WebSocket messages", "",
           "A frontend's API routes as the app declares them, generated at each build. Every route also "
           "answers with a trailing slash. The WebUI and Gradio's own routes live under `/`; the gradio_client "
           "API is listed on [its page](gradio.md). With `--api_key`, every route needs the key except "
           "`/health` and `/ready` ([Authentication](../operations/auth.md)).", "",
           "| method | path | what it does |", "| --- | --- | --- |"]
    for r in sorted(reference.routes(), key=lambda r: (r.path, r.methods)):
        out.append(f"| {' '.join(r.methods)} | `{r.path}` | {_cell(r.summary)} |")
    out += ["", "## WebSocket messages", "",
            "The messages each protocol reads (client) and sends (server); fields and examples on the "
            "[WebSockets](../api/websockets.md) page.", ""]
    for protocol, sides in reference.websocket_messages().items():
        out += [f"### {protocol}", "", "| side | messages |", "| --- | --- |"]
        out += [f"| {side} | {', '.join(f'`{m}`' for m in names)} |" for side, names in sides.items()]
        out.append("")
    return "\n".join(out)


def gradio_page() -> str:
    out = ["# gradio api_names", "",
           "The named endpoints of the gradio_client API, generated at each build from the Blocks the frontend "
           "registers (what `Client(url).view_api()` prints). Examples on the [gradio_client](../api/gradio.md) "
           "page.", ""]
    for name, e in reference.gradio_endpoints().items():
        out += [f"## `{name}`", "", e.description, "", f"Returns: {e.returns}.", ""]
        if e.parameters:
            out += ["| parameter | type | default |", "| --- | --- | --- |"]
            out += [f"| `{p.name}` | {p.type} | {'required' if p.required else f'`{p.default}`'} |"
                    for p in e.parameters]
        else:
            out.append("No parameters.")
        out.append("")
    return "\n".join(out)


def metrics_section() -> str:
    out = ["", "| series | type | labels | meaning |", "| --- | --- | --- | --- |"]
    for m in reference.metrics():
        out.append(f"| `{m.name}` | {m.kind} | {', '.join(f'`{x}`' for x in m.labels) or 'none'} | {_cell(m.help)} |")
    return "\n".join(out) + "\n"


# the packages in the order the data flows through them, then the serving layers and the tools
PACKAGE_ORDER = ("errors", "model", "text", "audio", "prompt", "lm", "flow", "hift", "pipeline", "speech", "service",
                 "frontend", "deploy", "batch", "vllm_plugin", "verify")


def _first_sentence(path: Path) -> str:
    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    first = " ".join(doc.split("\n\n")[0].split())
    return first.split(". ")[0].rstrip(".") if first else ""


def layout_section() -> str:
    """The package tree: each package's and module's first docstring sentence."""
    pkg = ROOT / "cosy"
    names = sorted(p.stem if p.is_file() else p.name for p in pkg.iterdir()
                   if (p.is_dir() and (p / "__init__.py").exists()) or (p.suffix == ".py" and p.stem != "__init__"))
    order = [n for n in PACKAGE_ORDER if n in names] + [n for n in names if n not in PACKAGE_ORDER]
    out = [""]
    for name in order:
        path = pkg / name
        if path.is_dir():
            out += [f"### `cosy/{name}/`", "", _first_sentence(path / "__init__.py"), "", "| module | what it holds |",
                    "| --- | --- |"]
            for module in sorted(path.rglob("*.py")):
                if module.name != "__init__.py" or module.parent != path:
                    rel = module.relative_to(path).as_posix()
                    out.append(f"| `{rel}` | {_cell(_first_sentence(module))} |")
            out.append("")
        else:
            out += [f"### `cosy/{name}.py`", "", _first_sentence(pkg / f"{name}.py"), ""]
    return "\n".join(out)


def runs(kind: str) -> list[dict]:
    """The benchmark runs of one kind in docs/performance/ (newest last)."""
    found = [json.loads(p.read_text()) | {"file": p.name} for p in sorted(DATA.glob(f"{kind}*.json"))]
    return sorted(found, key=lambda r: r["provenance"]["date"])


def _provenance(run: dict) -> str:
    p = run["provenance"]
    load = f" (load average at the start {p['load_at_start']})" if p.get("load_at_start") else ""
    commit = p["commit"][:10] + (" with uncommitted changes" if p["commit"].endswith("+dirty") else "")
    return (f"{p['machine']}{load}; {p['date']}; commit `{commit}`; "
            f"[data]({'performance/' + run['file']}), `{p['command']}`")


def _figure(name: str, draw) -> str:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig = plt.figure(figsize=(7, 3.4), dpi=110)
    draw(fig)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    plt.close(fig)
    with mkdocs_gen_files.open(f"performance/{name}.png", "wb") as f:
        f.write(buf.getvalue())
    return f"![{name}](performance/{name}.png)"


def performance_sections() -> str:
    out = []
    deployment = runs("deployment")
    if deployment:
        one = [r for r in deployment if int(r["args"].get("frontends", 1)) == 1]
        run = (one or deployment)[-1]  # the curve against concurrency: one frontend's newest run
        levels = run["levels"]

        def draw(fig):
            ax1, ax2 = fig.subplots(1, 2)
            xs = [lv["concurrency"] for lv in levels]
            ax1.plot(xs, [lv["all"]["first_p50"] for lv in levels], marker="o", label="p50")
            ax1.plot(xs, [lv["all"]["first_p95"] for lv in levels], marker="x", ls="--", label="p95")
            ax2.plot(xs, [lv["all"]["rtf_p50"] for lv in levels], marker="o", label="p50")
            ax2.plot(xs, [lv["all"]["rtf_p95"] for lv in levels], marker="x", ls="--", label="p95")
            ax1.set(xlabel="concurrent streams", ylabel="first packet (s)", title="First packet")
            ax2.set(xlabel="concurrent streams", ylabel="RTF", title="Real-time factor")
            for ax in (ax1, ax2):
                ax.grid(alpha=0.3)
                ax.legend(fontsize=7)
        out += ["## First packet and RTF against concurrency", "", _provenance(run), "",
                _figure("first_packet_rtf", draw), "",
                "| streams | requests | success | first packet p50 / p95 / p99 (s) | RTF p50 / p95 "
                "| audio s per wall s |",
                "| --- | --- | --- | --- | --- | --- |"]
        for lv in levels:
            a = lv["all"]
            out.append(f"| {lv['concurrency']} | {a['requests']} | {a['success']:.0%} | "
                       f"{a['first_p50']:.2f} / {a['first_p95']:.2f} / {a['first_p99']:.2f} | "
                       f"{a['rtf_p50']:.2f} / {a['rtf_p95']:.2f} | {a['audio_per_wall']:.3f} |")
        out.append("")
        by_frontends = {}
        for r in deployment:
            n = int(r["args"].get("frontends", 1))
            by_frontends[n] = r  # the newest run of each frontend count
        if len(by_frontends) > 1:
            def draw_scale(fig):
                ax = fig.subplots()
                xs = sorted(by_frontends)
                best = [max(lv["all"]["audio_per_wall"] for lv in by_frontends[n]["levels"]) for n in xs]
                ax.plot(xs, best, marker="o")
                ax.set_xticks(xs)
                ax.set(xlabel="frontends", ylabel="audio s per wall s (best level)",
                       title="Throughput per frontend count")
                ax.grid(alpha=0.3)
            out += ["## Throughput per frontend count", "",
                    "Each point is its own run (below, with its machine's load): read it as what each count "
                    "reached, not as a side-by-side comparison.", "",
                    _figure("frontends", draw_scale), "",
                    *[f"- {n} frontend(s): {_provenance(by_frontends[n])}" for n in sorted(by_frontends)], ""]
    lengths = runs("stream_length")
    if lengths:
        run = lengths[-1]

        def draw_len(fig):
            ax = fig.subplots()
            for series, points in run["series"].items():
                ax.plot([p["seconds"] for p in points], [p["cost_per_audio_s"] for p in points], marker="o",
                        label=series)
            ax.set(xlabel="utterance length (s of audio)", ylabel="compute s per audio s",
                   title="Streaming cost against length")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)
        out += ["## Streaming cost against length", "", _provenance(run), "", _figure("stream_length", draw_len), "",
                "| series | " + " | ".join(f"{p['seconds']} s" for p in next(iter(run["series"].values()))) + " |",
                "| --- |" + " --- |" * len(next(iter(run["series"].values())))]
        for series, points in run["series"].items():
            out.append(f"| {series} | " + " | ".join(f"{p['cost_per_audio_s']:.3f}" for p in points) + " |")
        out.append("")
    out += priority_section()
    return "\n".join(out)


def priority_section() -> list[str]:
    """bench/priority.py's runs, newest first: the listener's first packet and underruns under a saturating bulk
    job with the frontend's priorities on and off, and the bulk throughput of each (one table a run)."""
    found = runs("priority")
    if not found:
        return []
    out = ["## Priorities under saturation", "",
           "`bench/priority.py`: one backend and one frontend on one machine, a bulk job through the API that keeps "
           "them full, an interactive stream every few seconds; priorities on and off alternate in one run. The "
           "first packet is compared with the same stream on the idle deployment, measured in the same phase.", ""]
    for run in reversed(found):
        a = run["args"]
        out += [f"**{a['size']} model, {a['tokens']} speech tokens a request, {a['bulk']} bulk clients**: "
                + _provenance(run), "",
                "| priorities | streams | first packet p50 | p95 | idle p50 | p50 / idle | underrun mean "
                "| continuous | bulk audio-s per s |",
                "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
        for name, r in run["settings"].items():
            out.append(f"| {name} | {r['streams']} | {r['first_p50']:.2f} s | {r['first_p95']:.2f} s | "
                       f"{r['idle_first_p50']:.2f} s | {r['first_p50_vs_idle']:.2f} | {r['underrun_mean']:.2f} s | "
                       f"{r['continuous']:.0%} | {r['bulk_audio_per_wall']:.2f} |")
        out += ["", f"Bulk throughput with priorities over without: {run['bulk_on_vs_off']:.2f}.", ""]
    return out


def generate() -> None:
    """Write every generated page into the build (mkdocs-gen-files' virtual files, never into docs/)."""
    with mkdocs_gen_files.open("reference/flags.md", "w") as f:
        f.write(flags_page())
    with mkdocs_gen_files.open("reference/routes.md", "w") as f:
        f.write(routes_page())
    with mkdocs_gen_files.open("reference/gradio.md", "w") as f:
        f.write(gradio_page())
    with mkdocs_gen_files.open("development/layout.md", "a") as f:
        f.write(layout_section())
    with mkdocs_gen_files.open("operations/metrics.md", "a") as f:
        f.write(metrics_section())
    with mkdocs_gen_files.open("performance.md", "a") as f:
        f.write("\n" + performance_sections())


if __name__ == "<run_path>":  # run by mkdocs-gen-files (runpy.run_path); importing or running it writes nothing
    generate()
