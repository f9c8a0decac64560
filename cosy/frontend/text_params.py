"""The text controls' request fields, one definition for the HTTP and WebSocket surfaces (docs/api/text-control.md):
`language_hints` (a list, its first entry used, as the managed service publishes) and `enable_markdown_filter`."""
from __future__ import annotations

from pydantic import BaseModel, Field

from cosy.text.language import HINTS, check_language

__all__ = ["TextControls", "language_of"]


class TextControls(BaseModel):
    language_hints: list[str] | None = Field(
        None, description=f"the text's language, the first entry used ({', '.join(HINTS)}): numbers, dates, times "
                          "and money read in it (zh, en or none: the official normalizer)")
    enable_markdown_filter: bool | None = Field(
        None, description="the text is markdown: headings, emphasis, links, lists, tables, code and images "
                          "spoken as a listener should hear them; default false")


def language_of(controls: TextControls, prefix: str = "") -> str | None:
    """The hint to use; BadRequest naming `prefix` + language_hints and the choices."""
    return check_language(controls.language_hints, f"{prefix}language_hints")
