"""API keys from files (`--api_key_file`, `--llm_api_key_file`), so that keys stay out of `ps` and shell history.

    key = read_key_file("/run/secrets/cosy_key", "--api_key_file")   # the file's text, trailing newline stripped

A missing, unreadable or empty file is a `KeyFileError` (a ValueError) whose message names the flag and
the file, never the key.
"""
from __future__ import annotations

from pathlib import Path


class KeyFileError(ValueError):
    pass


def read_key_file(path: str | Path, flag: str) -> str:
    p = Path(path).expanduser()
    try:
        text = p.read_text("utf-8")
    except FileNotFoundError:
        raise KeyFileError(f"{flag}: no such file {str(p)!r}") from None
    except (OSError, UnicodeDecodeError) as e:
        raise KeyFileError(f"{flag}: cannot read {str(p)!r} ({type(e).__name__})") from None
    key = text.rstrip("\r\n")
    if not key.strip():
        raise KeyFileError(f"{flag}: {str(p)!r} is empty (write the key into it)")
    if "\n" in key or "\r" in key:
        raise KeyFileError(f"{flag}: {str(p)!r} holds more than one line (write only the key into it)")
    return key
