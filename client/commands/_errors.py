"""Every way `offload` can fail, as one line and one stable exit code.

The CLI turns exceptions into output in exactly one place, :func:`describe`, so a message
never repeats its cause (`cannot connect: cannot connect to ...`), never shows a Python repr
(`ConnectError('...')`), and the same mistake always exits with the same code:

====  ======================================================================================
code  class
====  ======================================================================================
0     success
1     `subscribe` printed at least one error line, or `--count N` messages did not come
      within `--timeout`; `discover` found no record
2     usage: a bad flag, topic or URL, unusable configuration, a local file that cannot be
      read or written (checked before anything connects); an encrypted payload that no
      identity given opens (`fetch`: `--identity` is missing or wrong)
3     the broker cannot be reached, refused the connection, or refused a message (a
      failure reason code in its PUBACK: its ACL, a quota)
4     the message is too large and neither offload nor chunking could carry it
5     an HTTP transfer failed (upload, fetch, not found, checksum mismatch), or the bytes
      fetched cannot be decrypted or decompressed (damaged, truncated, a bomb)
6     the gateway refused the login or the access (HTTP 401/403: a wrong or missing
      password, a topic the user may not use)
130   interrupted (Ctrl-C)
141   stdout was closed by its reader (`offload fetch URL | head -c 10`): quiet, as a
      process killed by SIGPIPE
====  ======================================================================================
"""

from __future__ import annotations

import argparse
import errno
from typing import TYPE_CHECKING, NoReturn

from ..core._exceptions import (
    ChecksumMismatchError,
    ChunkBufferOverflow,
    ChunkTimeoutError,
    ConfigError,
    ConnectionFailed,
    DecompressionBomb,
    FetchError,
    InvalidTopic,
    MalformedChunk,
    MalformedPlaceholder,
    MessageTooLarge,
    NoMatchingIdentity,
    OffloadError,
    PayloadChecksumMismatch,
    PayloadDecodeError,
    PayloadNotFound,
    PublishRejected,
    TransferError,
    UntrustedEndpoint,
    UploadError,
)

if TYPE_CHECKING:
    import httpx

EXIT_OK, EXIT_ERRORS, EXIT_USAGE, EXIT_CONNECT, EXIT_TOO_LARGE, EXIT_TRANSFER = range(6)
EXIT_REFUSED = 6
EXIT_INTERRUPTED = 130
EXIT_PIPE = 141  # 128 + SIGPIPE: what a shell reports for `cat` in the same place

#: HTTP statuses of a refused login or access: never worth retrying, the user must act.
REFUSED_STATUSES = frozenset({401, 403})

EXIT_CODES_EPILOG = (
    "Exit codes: 0 ok, 1 error lines / nothing found / too few messages, 2 usage (flag, topic, "
    "URL, configuration, local file, no identity opens the payload), 3 broker connection or "
    "a message the broker refused, 4 "
    "message too large, 5 HTTP transfer failed or payload undecodable, 6 gateway refused the "
    "login or access, 130 interrupted, 141 stdout closed."
)


class UsageError(Exception):
    """A mistake in the command line, reported against the (sub)command it belongs to."""

    def __init__(self, prog: str, message: str) -> None:
        super().__init__(message)
        self.prog = prog


class StdoutClosed(Exception):
    """The reader of stdout went away (EPIPE): the command stops quietly, exit 141."""


class Parser(argparse.ArgumentParser):
    """argparse that raises instead of printing a page of usage and exiting.

    The message then becomes one line naming the subcommand and pointing at its `--help`.
    """

    def error(self, message: str) -> NoReturn:
        raise UsageError(self.prog, message)


# Most specific first: the first matching class names the cause (the `error` field of
# `subscribe`'s JSON lines, and the start of the CLI's error line).
_CAUSES: tuple[tuple[type[OffloadError], str], ...] = (
    (ChecksumMismatchError, "checksum mismatch"),
    (PayloadChecksumMismatch, "checksum mismatch"),
    (ChunkTimeoutError, "chunk timeout"),
    (ChunkBufferOverflow, "buffer overflow"),
    (PayloadNotFound, "not found"),
    (UntrustedEndpoint, "untrusted endpoint"),
    (FetchError, "fetch failed"),
    (UploadError, "upload failed"),
    (MalformedPlaceholder, "malformed placeholder"),
    (MalformedChunk, "malformed chunk"),
    (NoMatchingIdentity, "no matching identity"),
    (DecompressionBomb, "decompression bomb"),
    (PayloadDecodeError, "undecodable payload"),
)


def refused(error: BaseException) -> bool:
    """Whether the gateway refused the login or the access (401/403)."""
    return isinstance(error, TransferError) and error.status in REFUSED_STATUSES


def cause(error: OffloadError) -> str:
    """A short, stable name for why a message failed (the `error` field of JSON lines)."""
    if refused(error):
        return "access refused"
    for kind, name in _CAUSES:
        if isinstance(error, kind):
            return name
    return type(error).__name__


def http_reason(exc: httpx.HTTPError) -> str:
    """What went wrong on the wire, in words (httpx's reprs name internal classes)."""
    import httpx  # loaded already: `exc` is one of its errors (no start-up cost for the CLI)

    text = str(exc) or type(exc).__name__
    if isinstance(exc, httpx.ConnectTimeout):
        return "timed out connecting"
    if isinstance(exc, httpx.TimeoutException):
        return "timed out"
    if isinstance(exc, httpx.ConnectError):
        if f"[Errno {errno.ECONNREFUSED}]" in text:
            return "cannot connect (connection refused: is the gateway running there?)"
        return f"cannot connect ({text})"
    if isinstance(exc, httpx.RemoteProtocolError):
        return f"the connection broke off ({text})"
    if isinstance(exc, httpx.UnsupportedProtocol):
        return "not an http:// or https:// URL"
    return text


def _transfer_line(exc: TransferError) -> str:
    import httpx  # loaded already: a TransferError comes out of an httpx transfer

    name = cause(exc)
    detail = str(exc).removeprefix(f"{exc.url}: ")
    if isinstance(exc.__cause__, httpx.HTTPError):
        detail = http_reason(exc.__cause__)
    # The library words its details for logs ("fetch failed: ..."): drop the repeated cause.
    for words in (name, "fetch failed", "upload failed"):
        detail = detail.removeprefix(f"{words}: ")
    if exc.status is not None and 300 <= exc.status < 400:
        detail += " (a redirect: --endpoint must be the gateway's base URL, http://HOST:PORT)"
    elif exc.status == 401 and "SCRAM" not in detail and "token" not in detail:
        # SCRAM's own words say what to check, and a refused token is no missing login.
        detail += "; log in with --username and --password, or OFFLOAD_USERNAME/OFFLOAD_PASSWORD"
    return f"{name}: {exc.url}: {detail}"


def describe(exc: BaseException) -> tuple[int, str]:
    """The exit code and the one line to print for a failure."""
    if isinstance(exc, UsageError):
        return EXIT_USAGE, f"{exc.prog}: error: {exc} (see '{exc.prog} --help')"
    code, line = _describe(exc)
    return code, f"offload: {line}"


def _describe(exc: BaseException) -> tuple[int, str]:
    if isinstance(exc, (ConfigError, InvalidTopic)):
        return EXIT_USAGE, f"error: {exc}"
    if isinstance(exc, (ConnectionFailed, PublishRejected)):  # the broker said no
        return EXIT_CONNECT, str(exc)
    if isinstance(exc, MessageTooLarge):
        return EXIT_TOO_LARGE, str(exc)
    if isinstance(exc, TransferError):
        return EXIT_REFUSED if refused(exc) else EXIT_TRANSFER, _transfer_line(exc)
    if isinstance(exc, NoMatchingIdentity):  # the reader's keys, not the payload
        return EXIT_USAGE, str(exc)
    if isinstance(exc, PayloadDecodeError):  # what was fetched is damaged
        return EXIT_TRANSFER, f"{cause(exc)}: {exc}"
    if isinstance(exc, OffloadError):
        return EXIT_ERRORS, str(exc)
    if isinstance(exc, OSError):  # a local file: missing input, unwritable output
        where = f": {exc.filename}" if exc.filename else ""
        return EXIT_USAGE, f"error: {exc.strerror or exc}{where}"
    if isinstance(exc, KeyboardInterrupt):
        return EXIT_INTERRUPTED, "interrupted"
    raise TypeError(f"no exit code for {type(exc).__name__}") from exc


def detail(exc: OffloadError) -> str:
    """The `detail` field of a `subscribe` error line: the same words as the CLI's line."""
    if isinstance(exc, TransferError):
        return _transfer_line(exc).removeprefix(f"{cause(exc)}: ")
    return str(exc)
