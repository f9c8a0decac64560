"""`python -m cosy batch MANIFEST --out DIR [--shard i/n] [frontend flags]`: a manifest in, audio files out.

Every flag of the frontend that concerns synthesis works here too (`--model_dir`, `--data_dir` for saved
voices, `--workers`, `--max_batch`, `--llm_base_url` for one or many backends, `--llm_api_key(_file)`,
`--device`, `--dtype`, ...: `python app.py --help`); the ones that concern serving (`--port`, `--api_key`)
are accepted and unused. Exit status: 0 when every line of this shard (as the manifest is now) is done, 1
when some failed (see the results file), 2 when the run could not start or stopped early (SIGTERM, Ctrl-C, an
output folder it cannot write: the message says why; running the same command again goes on).
"""
from __future__ import annotations

import argparse
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path

USAGE = ("python -m cosy batch MANIFEST --out DIR [--shard i/n] [--in_flight N] [--subtitles srt|vtt] "
         "[frontend flags]")


def parse_args(argv: Sequence[str]) -> tuple[argparse.Namespace, argparse.Namespace]:
    """(the batch's own flags, the frontend's flags); exits with a usage error naming the problem."""
    from cosy.batch.manifest import parse_shard
    p = build_parser()
    args, rest = p.parse_known_args(argv)
    from cosy.pipeline.request import SAMPLE_RATE_RANGE, check_range
    try:
        args.shard = parse_shard(args.shard)
        check_range(args.sample_rate, "--sample_rate", *SAMPLE_RATE_RANGE, kind=int)
    except ValueError as e:  # SynthesisError is a ValueError too
        p.error(str(e))
    if args.in_flight is not None and args.in_flight < 1 or args.retries < 0:
        p.error("--in_flight must be >= 1 and --retries >= 0")
    if not args.manifest.is_file():
        p.error(f"manifest {str(args.manifest)!r} is not a file")
    from cosy.frontend.server import parse_args as frontend_args
    return args, frontend_args(list(rest))


def build_parser() -> argparse.ArgumentParser:
    """The batch's own flags (the frontend's come after them; the docs' flags reference reads both)."""
    from cosy.pipeline.subtitles import FORMATS as SUBTITLE_FORMATS
    p = argparse.ArgumentParser(prog="python -m cosy batch", usage=USAGE, description=__doc__.split("\n\n")[0])
    p.add_argument("manifest", type=Path, help="JSON Lines, one utterance a line (docs: Batch synthesis)")
    p.add_argument("--out", type=Path, required=True, help="folder for the audio files (ID.FORMAT) and results")
    p.add_argument("--shard", default="0/1", help="i/n: take line k when k %% n == i (one process per shard, "
                   "same --out; default 0/1, every line)")
    p.add_argument("--in_flight", type=int, default=None,
                   help="lines synthesized at once (default workers x max_batch + workers: every worker's batch "
                        "full, one more waiting each)")
    p.add_argument("--retries", type=int, default=3, help="tries again after busy or unavailable (default 3)")
    p.add_argument("--sample_rate", type=int, default=24000, help="lines' default output rate (default 24000)")
    p.add_argument("--subtitles", choices=SUBTITLE_FORMATS, default=None,
                   help="a subtitle file ID.srt or ID.vtt beside each line's audio, for the lines without their "
                        "own `subtitles` field (default: only those that ask)")
    p.add_argument("--progress", choices=("auto", "bar", "log"), default="auto",
                   help="a progress bar (on a terminal, the default) or a log line every 10 s")
    return p


READY_WAIT = 120.0  # s for the workers and (with --llm_base_url) one backend to serve


def wait_ready(ready) -> str | None:
    """Poll the frontend's readiness check (`cosy.frontend.server.readiness`: workers alive, a backend serving
    our llm.pt, whose context length it learns) until it passes: None, or what is still wrong."""
    deadline = time.monotonic() + READY_WAIT
    while True:
        ok, why = ready()
        if ok:
            return None
        if time.monotonic() > deadline:
            return why
        time.sleep(1.0)


def results_name(shard: tuple[int, int]) -> str:
    """One results file per shard, so shards sharing an output folder never write the same file."""
    i, n = shard
    return "results.jsonl" if n == 1 else f"results.{i}-of-{n}.jsonl"


def main(argv: Sequence[str]) -> int:
    args, fe = parse_args(argv)
    try:
        return _run(args, fe)
    except KeyboardInterrupt:  # before the run's own handler (loading the model, waiting for backends)
        print("error: interrupted before any line was synthesized", file=sys.stderr, flush=True)
        return 2


def _run(args: argparse.Namespace, fe: argparse.Namespace) -> int:
    from cosy.batch.manifest import read_manifest
    from cosy.batch.progress import Progress
    from cosy.batch.results import Results
    from cosy.batch.runner import BatchRunner
    from cosy.errors import CosyError
    from cosy.frontend.server import build_service, readiness, say
    try:
        entries = read_manifest(args.manifest, args.shard, args.sample_rate, args.subtitles)
    except OSError as e:
        print(f"error: cannot read manifest {args.manifest}: {e.strerror or e}", file=sys.stderr)
        return 2
    try:
        results = Results(args.out, results_name(args.shard)).open(keep={e.key for e in entries})
    except OSError as e:
        print(f"error: cannot use --out {args.out}: {e}", file=sys.stderr)
        return 2
    service = summary = None
    try:
        try:
            service = build_service(fe)
        except (RuntimeError, ValueError, OSError, CosyError) as e:  # ModelDirError is a ValueError
            print(f"error: {e}", file=sys.stderr, flush=True)
            return 2
        problem = wait_ready(readiness(service, fe.llm_base_url, fe.llm_api_key))
        if problem:
            print(f"error: not ready after {READY_WAIT:.0f} s: {problem}", file=sys.stderr, flush=True)
            return 2
        in_flight = args.in_flight or fe.workers * service.pool.max_batch + fe.workers
        runner = BatchRunner(service, results, in_flight, args.retries)
        # both stop at once: the lines in flight are cancelled, the rest is left for the next run
        signal.signal(signal.SIGTERM, lambda *_: runner.stop("stopped by SIGTERM"))
        signal.signal(signal.SIGINT, lambda *_: runner.stop("interrupted (Ctrl-C)"))
        bar = {"auto": None, "bar": True, "log": False}[args.progress]
        say(f"batch: {len(entries)} lines of {args.manifest} (shard {args.shard[0]}/{args.shard[1]}), "
            f"{in_flight} in flight, into {args.out}")
        summary = runner.run(entries, Progress(len(entries), bar=bar))
    finally:
        if service is not None:
            service.pool.close()
        try:
            results.close()
        except OSError as e:  # the records appended so far stay, and the next run reads them
            print(f"error: cannot rewrite {results.path}: {e}", file=sys.stderr, flush=True)
            if summary is not None:
                summary.aborted = summary.aborted or f"cannot write {args.out}: {e}"
    return _report(summary, results.path, say)


def _report(summary, results_path: Path, say) -> int:
    """Say what the run did; the exit status (docs: Batch synthesis)."""
    rtf = summary.wall_s / summary.audio_s if summary.audio_s else float("nan")
    redone = ""
    if summary.redone:
        redone = (", 1 redone: its line changed" if summary.redone == 1
                  else f", {summary.redone} redone: their lines changed")
    say(f"batch: {summary.ok} done, {summary.failed} failed, {summary.skipped} done before{redone}; "
        f"{summary.audio_s:.1f} s of audio in {summary.wall_s:.1f} s (RTF {rtf:.3f}); results in {results_path}")
    if summary.aborted:
        say(f"batch stopped early: {summary.aborted}; run the same command again to go on")
        return 2
    return 1 if summary.failed else 0
