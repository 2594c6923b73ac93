"""What `offload` writes on stdout: one JSON line per message, one schema for every command.

A *message line* describes one message, whichever command handled it (`publish`, `upload`,
`subscribe`, `fetch -o FILE`). Its first six keys are always present, in this order, with
the same meaning everywhere; `null` where the command cannot know the value:

==========  ===================================================================================
`topic`     the MQTT topic (`null` for `fetch`: a URL does not say)
`id`        the message id (UUID) of an offloaded or chunked message; `null` when direct
`size`      payload bytes
`sha256`    SHA-256 of the payload, lowercase hex (`fetch`: of the bytes written)
`route`     `direct`, `offloaded` (a placeholder on the broker, the payload on the gateway)
            or `chunked` (ADR-23); `upload` and `fetch` are always `offloaded`
`url`       where the payload can be fetched (`offload fetch URL`); `null` when not offloaded,
            and in `subscribe` lines
==========  ===================================================================================

Then the command's own keys: `qos`, `retain` (publish, subscribe), `packets` (publish: PUBLISH
packets sent), `resumed_from` (upload: bytes already on the gateway), `content_type`,
`user_properties` (subscribe, when set), `file` (where the payload was written).

An *error line* (subscribe) has `topic`, `error` (the cause, see
:func:`client.commands._errors.cause`),
`id` and `detail`. `discover` prints the discovery record with its `topic`.

Stdout may be a pipe whose reader stops early (`offload fetch URL | head -c 10`): a write
then raises :class:`client.commands._errors.StdoutClosed`, which the CLI ends quietly with 141.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from ._errors import StdoutClosed

__all__ = ["emit", "message_line", "write_bytes"]


def message_line(
    *,
    topic: str | None,
    message_id: str | None,
    size: int,
    sha256: str | None,
    route: str,
    url: str | None,
    **extra: Any,
) -> dict[str, Any]:
    """A message line: the six keys every command prints, then the command's own."""
    doc: dict[str, Any] = {
        "topic": topic,
        "id": message_id,
        "size": size,
        "sha256": sha256,
        "route": route,
        "url": url,
    }
    doc.update(extra)
    return doc


def emit(doc: dict[str, Any]) -> None:
    """One JSON line on stdout, flushed (a consumer of `subscribe` reads it at once).

    Raises:
        StdoutClosed: the reader went away.
    """
    try:
        sys.stdout.write(json.dumps(doc, separators=(",", ":")) + "\n")
        sys.stdout.flush()
    except BrokenPipeError:
        raise StdoutClosed from None


class BinaryStdout:
    """`sys.stdout.buffer` as a binary file whose EPIPE is :class:`StdoutClosed`.

    Kept apart from any socket error: a BrokenPipeError from the gateway's connection is a
    failed transfer, this one is a reader that has seen enough.
    """

    def write(self, data: bytes) -> int:
        try:
            return sys.stdout.buffer.write(data)
        except BrokenPipeError:
            raise StdoutClosed from None

    def flush(self) -> None:
        try:
            sys.stdout.buffer.flush()
        except BrokenPipeError:
            raise StdoutClosed from None


def write_bytes(data: bytes) -> None:
    """Payload bytes on stdout.

    Raises:
        StdoutClosed: the reader went away.
    """
    BinaryStdout().write(data)
