"""The gateway's JSON answers: one JSON document, then a newline, as a line of text ends."""

from __future__ import annotations

from typing import Any

from starlette.responses import JSONResponse


class JSONAnswer(JSONResponse):
    """starlette's `JSONResponse` with its body ended by a newline.

    `curl URL` then prints an answer (a stored message's `{id, url, ...}`, an error's
    `{"detail": ...}`) on a line of its own instead of running it into the shell's prompt,
    and a script reading answers line by line gets whole lines. JSON allows whitespace after
    the document: every parser reads the same value.
    """

    def render(self, content: Any) -> bytes:
        return super().render(content) + b"\n"
