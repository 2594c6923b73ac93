"""Text the gateway stores must be UTF-8: anything committed is readable by every reader.

Python strings can hold lone surrogates (`"\\ud800"`), which JSON's `\\uXXXX` escapes
produce and UTF-8 cannot encode. Stored in a manifest they survive the gateway's own JSON
(escaped again), but `GET /msg/{id}` (its headers and JSON), a Spark reader and any other
language's JSON parser cannot turn them back into text: one such message would stop every
read of its topic. So they are refused at the door, with a reason, before anything is kept.

Inputs decoded from bytes with strict UTF-8 (BSON, percent-encoding, tus metadata) never
hold one; JSON bodies (`/direct/grant`, `/direct/commit`) can. `manifest_text_problem` is
also the last check of every commit (`gateway.http._ingest.commit_or_discard`), whatever the path.
"""

from __future__ import annotations

from client.protocol import Manifest


def text_problem(text: str, what: str) -> str | None:
    """Why `text` cannot be stored as UTF-8 (a lone surrogate), None when it can."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return f"{what} {text!r:.80} is not valid Unicode ({exc.reason}): refused"
    return None


def manifest_text_problem(manifest: Manifest) -> str | None:
    """The first text field of `manifest` that cannot be stored as UTF-8, None when none."""
    texts = [("topic", manifest.topic.value), ("object key", manifest.data_key)]
    texts += [("header name", name) for name, _ in manifest.headers]
    texts += [("content type", manifest.content_type or ""), ("file name", manifest.filename or "")]
    for what, text in texts:
        problem = text_problem(text, what)
        if problem is not None:
            return problem
    return None
