"""Command line synthesis:

    python -m cosy --model_dir DIR --mode zero_shot|cross_lingual|instruct|voice|vc --text T
        [--prompt_text T --prompt_wav F --instruct_text T --voice_id ID --source_wav F]
        [--stream] [--ssml] [--hot_fix JSON] [--speed S] [--seed N] [--save_voice ID] [--data_dir D]
        [--llm_base_url URL[,URL...] --llm_api_key KEY] [--device cuda --dtype bfloat16] --out out.wav
        [--subtitles out.srt|out.vtt]

    python -m cosy batch MANIFEST --out DIR [--shard i/n] [frontend flags]   (cosy.batch.cli)
"""
from __future__ import annotations

import argparse
import io
import os
import sys
import time
from pathlib import Path

import numpy as np
import soundfile as sf

from cosy.deploy.lexicon import FILE_NAME as LEXICON_FILE
from cosy.deploy.lexicon import parse_file
from cosy.deploy.voices import VoiceStore
from cosy.errors import CosyError
from cosy.model.precision import DTYPE_CHOICES, describe, resolve_dtype
from cosy.pipeline.engine import Engine
from cosy.pipeline.request import MODES, SPEED_RANGE, SynthesisError, SynthesisRequest
from cosy.pipeline.subtitles import subtitle_format, subtitles
from cosy.pipeline.timing import SentenceMark, SentenceTiming
from cosy.text.lexicon import parse_hot_fix, request_fixes


def build_parser() -> argparse.ArgumentParser:
    """The CLI's flags (the docs' flags reference is generated from this parser)."""
    p = argparse.ArgumentParser(prog="python -m cosy",
                                description="CosyVoice2 / CosyVoice3 text-to-speech to an audio file.")
    p.add_argument("--model_dir", required=True, help="a CosyVoice2 model directory (official layout)")
    p.add_argument("--mode", choices=MODES, required=True,
                   help="zero_shot (--prompt_wav + --prompt_text), cross_lingual (--prompt_wav), instruct "
                        "(--prompt_wav + --instruct_text), voice (--voice_id), vc (--source_wav + --prompt_wav)")
    p.add_argument("--text", default="", help="text to speak (not needed for --mode vc)")
    p.add_argument("--prompt_text", default="", help="transcript of --prompt_wav (zero_shot)")
    p.add_argument("--prompt_wav", help="voice prompt audio: wav/mp3/flac/ogg, >= 16 kHz, <= 30 s")
    p.add_argument("--instruct_text", default="", help="instruction, e.g. 用四川话说这句话 (instruct)")
    p.add_argument("--voice_id", help="a saved voice (mode voice), from --data_dir")
    p.add_argument("--source_wav", help="speech to convert into the prompt's voice (mode vc)")
    p.add_argument("--save_voice", metavar="ID", help="also save --prompt_wav/--prompt_text as voice ID")
    p.add_argument("--data_dir", default="data", help="where saved voices live (DATA_DIR/voices)")
    p.add_argument("--stream", action="store_true", help="synthesize in streaming chunks")
    p.add_argument("--speed", type=float, default=1.0, help=f"{SPEED_RANGE[0]} to {SPEED_RANGE[1]}")
    p.add_argument("--seed", type=int, help="same seed + same inputs = same audio")
    p.add_argument("--ssml", action="store_true", help="--text is an SSML document (docs: SSML: breaks, sub, "
                   "say-as, phoneme, rate, volume)")
    p.add_argument("--hot_fix", default="", metavar="JSON", help="pronunciation fixes, the managed service's "
                   "shape: '{\"pronunciation\": [{\"重庆\": \"chong2 qing4\"}], \"replace\": [{\"WHO\": "
                   "\"世界卫生组织\"}]}' (before DATA_DIR/lexicon.tsv's entries, which apply too; docs: text control)")
    p.add_argument("--language_hints", default=None, metavar="LANG", help="the text's language (zh, en, de, es, fr, "
                   "it, ru, ja, ko): numbers, dates, times and money read in it (docs: text control)")
    p.add_argument("--enable_markdown_filter", action="store_true", help="--text is markdown: spoken as a "
                   "listener should hear it (docs: text control)")
    p.add_argument("--greedy", action="store_true", help="argmax decoding instead of RAS sampling "
                   "(to compare the embedded LM with a backend)")
    p.add_argument("--ttsfrd_dir", help="CosyVoice-ttsfrd resource dir (text normalization; wetext otherwise)")
    p.add_argument("--llm_base_url", help="LM backend(s), comma-separated (http://HOST:8000/v1); "
                   "default: run the LM in this process")
    p.add_argument("--llm_api_key", default=os.environ.get("COSY_LLM_API_KEY"),
                   help="the backend's API key (default: $COSY_LLM_API_KEY)")
    p.add_argument("--llm_variant", default=None,
                   help="LM checkpoint: default (llm.pt) or rl (CosyVoice3: llm.rl.pt, RL-tuned)")
    p.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N (default cpu)")
    p.add_argument("--dtype", choices=DTYPE_CHOICES, default="float32",
                   help="the LM's and flow estimator's dtype; the ODE, the flow encoder and HiFT stay float32 "
                        "(default float32; float16 needs CUDA; auto: bfloat16 for each where the CPU or GPU has "
                        "bfloat16 units, float32 elsewhere; docs: Precision)")
    p.add_argument("--no_tf32", dest="tf32", action="store_false",
                   help="strict float32 on CUDA (default: TF32 matmuls and convolutions; docs: Precision)")
    p.add_argument("--compile", action="store_true",
                   help="torch.compile the flow estimator and the embedded LM's stack (compiled at start-up; "
                        "fused kernels, mainly for GPUs; docs: Precision)")
    p.add_argument("--out", required=True, help="output wav file (the model's rate, 16-bit; .flac works too); "
                   "written only when the whole utterance is there")
    p.add_argument("--subtitles", metavar="PATH", help="also write subtitles, one cue per sentence with its "
                   "text as given and its exact times in --out: SRT (.srt) or WebVTT (.vtt) by the extension "
                   "(docs: Timestamps)")
    return p


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The CLI's flags, checked; exits with a usage error naming the problem."""
    p = build_parser()
    args = p.parse_args(argv)
    try:
        resolve_dtype(args.dtype, args.device)
    except (ValueError, RuntimeError) as e:  # a dtype the device cannot run, or a malformed device
        p.error(str(e))
    problem = out_problem(Path(args.out))
    if problem:
        p.error(f"--out {args.out}: {problem}")
    if args.subtitles is not None:
        try:
            subtitle_format(args.subtitles)
        except ValueError as e:
            p.error(f"--subtitles: {e}")
        folder = Path(os.path.realpath(args.subtitles)).parent
        if not folder.is_dir() or Path(args.subtitles).is_dir():
            p.error(f"--subtitles {args.subtitles}: give the path of a file in an existing folder")
    return args


def out_format(out: Path) -> str:
    """The libsndfile format --out's extension names (WAV when it names none)."""
    ext = out.suffix[1:].upper()
    return ext if ext in sf.available_formats() else "WAV"


def out_problem(out: Path) -> str | None:
    """Why --out cannot be written (before the model loads), or None."""
    if out.exists() and not out.is_file():
        return "is not a regular file: give the path of the file to write"
    folder = Path(os.path.realpath(out)).parent
    if not folder.is_dir():
        return f"its folder {str(folder)!r} does not exist"
    fmt = out_format(out)
    if not sf.check_format(fmt, "PCM_16"):
        return f"{fmt} files do not hold 16-bit PCM, which this CLI writes: use a .wav file (or .flac)"
    return None


def write_whole(path: Path, data: bytes) -> None:
    """`path` holds `data` whole or is as it was: written beside it, synced, renamed over it."""
    part = path.with_name(f".{path.name}.{os.getpid()}.part")
    try:
        with open(part, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(part, path)
    finally:
        part.unlink(missing_ok=True)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["batch"]:
        from cosy.batch.cli import main as batch
        return batch(argv[1:])
    args = parse_args(argv)
    try:
        if args.dtype != "float32":  # what was chosen, and why (`auto`)
            roles = ("flow",) if args.llm_base_url else ("lm", "flow")
            print(f"dtype: {describe(args.dtype, args.device, roles)}", file=sys.stderr)
        engine = Engine.from_model_dir(args.model_dir, device=args.device, dtype=args.dtype, tf32=args.tf32,
                                       ttsfrd_dir=args.ttsfrd_dir, llm_base_url=args.llm_base_url,
                                       llm_api_key=args.llm_api_key, llm_variant=args.llm_variant,
                                       compile=args.compile)
        voices = VoiceStore(Path(args.data_dir) / "voices")
        use_voice = args.mode == "voice" and args.voice_id
        voice = voices.load(args.voice_id, family=engine.family.name) if use_voice else None
        req = SynthesisRequest(mode=args.mode, text=args.text, prompt_text=args.prompt_text,
                               prompt_wav=args.prompt_wav, instruct_text=args.instruct_text,
                               voice=voice.features if voice else None, source_wav=args.source_wav,
                               stream=args.stream, speed=args.speed, seed=args.seed,
                               greedy=args.greedy, ssml=args.ssml, language=args.language_hints,
                               markdown=args.enable_markdown_filter)
        req.fixes = request_fixes(parse_hot_fix(args.hot_fix, "--hot_fix"), _lexicon(Path(args.data_dir)),
                                  engine.family.phoneme_tags, req.text, req.ssml)
        if voice is not None:
            req.prompt_text = voice.prompt_text
        req.check()  # a bad request (malformed SSML ...) writes no file
        if args.save_voice:
            if not args.prompt_wav:
                raise SynthesisError("--save_voice needs --prompt_wav and --prompt_text")
            req.voice = engine.prompt_features(args.prompt_wav)
            voices.save(args.save_voice, args.prompt_text, req.voice, family=engine.family.name)
            print(f"saved voice '{args.save_voice}'", file=sys.stderr)
        start, first, chunks, sentences = time.perf_counter(), None, [], []
        for chunk in _chunks(engine, req, sentences):
            first = first or time.perf_counter() - start
            chunks.append(chunk.numpy())
        samples = sum(len(c) for c in chunks)
        # the file is made only once the whole utterance is there: a request refused mid-way (a <phoneme>
        # the model has no token for, Ctrl-C) writes nothing, and an earlier file under that name stays
        data = io.BytesIO()
        sf.write(data, np.concatenate(chunks) if chunks else np.zeros(0, np.float32), engine.sample_rate,
                 subtype="PCM_16", format=out_format(Path(args.out)))
        try:
            write_whole(Path(os.path.realpath(args.out)), data.getvalue())
        except OSError as e:  # the output's folder: full, read-only, gone
            print(f"error: cannot write --out {args.out}: {e.strerror or e}", file=sys.stderr)
            return 2
        if args.subtitles is not None:
            cues = subtitles(sentences, subtitle_format(args.subtitles)).encode()
            try:
                write_whole(Path(os.path.realpath(args.subtitles)), cues)
            except OSError as e:
                print(f"error: cannot write --subtitles {args.subtitles}: {e.strerror or e}", file=sys.stderr)
                return 2
    except CosyError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("error: interrupted: nothing was written", file=sys.stderr)
        return 130
    took = time.perf_counter() - start
    audio_s = samples / engine.sample_rate
    print(f"wrote {args.out}: {audio_s:.2f} s of audio in {took:.2f} s (first chunk {first or 0:.2f} s, "
          f"RTF {took / max(audio_s, 1e-9):.2f}{_peak_gpu(args.device)})", file=sys.stderr)
    return 0


def _peak_gpu(device: str) -> str:
    if not device.startswith("cuda"):
        return ""
    import torch
    return f", peak GPU memory {torch.cuda.max_memory_allocated(device) / 2**30:.2f} GiB"


def _lexicon(data_dir: Path) -> tuple:
    """DATA_DIR/lexicon.tsv's entries (none without the file); a file that does not load is an error here
    (LexiconFileError naming the line): a one-off run has no last good lexicon to fall back on."""
    try:
        return tuple(parse_file((data_dir / LEXICON_FILE).read_bytes()).values())
    except FileNotFoundError:
        return ()


def _chunks(engine: Engine, req: SynthesisRequest, sentences: list[SentenceTiming]):
    """The request's chunks; each sentence's timing is appended to `sentences` as it ends."""
    if req.voice is not None and req.mode in ("zero_shot", "voice"):
        req.mode = "voice"  # features computed once (--save_voice) are used as they are

    def ended(mark: SentenceMark) -> None:
        if mark.kind == "end":
            sentences.append(mark.sentence)

    return engine.synthesize(req, on_mark=ended)


if __name__ == "__main__":
    sys.exit(main())
