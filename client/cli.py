"""`offload`: publish, subscribe, fetch and discover from the command line.

Settings are layered defaults < config file < environment (`OFFLOAD_*`) < flags, see
:mod:`client._config`. Output is machine-readable: `publish` prints one JSON line describing
what it did, `subscribe` one JSON line per message (`topic`, `size`, `sha256`, `route`, ...)
or per error (`error` names the cause: `checksum mismatch`, `chunk timeout`, `not found`, ...).

Errors are one line on stderr and a stable exit code per class; the table is in
:mod:`client._cli_errors` and the README.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import json
import logging
import os
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, BinaryIO, cast
from urllib.parse import urlsplit

import httpx

from ._cli_errors import (
    EXIT_CODES_EPILOG,
    EXIT_ERRORS,
    EXIT_OK,
    Parser,
    UsageError,
    cause,
    describe,
    detail,
)
from ._client import Client
from ._config import BrokerUrl, ClientSettings, load_settings
from ._exceptions import ConfigError, InvalidTopic, OffloadError, UploadError
from ._http import HttpTransport
from ._message import Message, MessageError, PublishResult
from ._progress import CountingReader, CountingWriter, Progress
from ._scram import gateway_auth
from ._upload import TusUploader, state_path
from .protocol import MessageId, Topic, TopicFilter

PROGRESS_MIN_BYTES = 8 << 20  # smaller files finish before a bar is worth drawing

__all__ = ["build_parser", "cause", "main"]


def _emit(doc: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(doc, separators=(",", ":")) + "\n")
    sys.stdout.flush()


def _result_doc(result: PublishResult) -> dict[str, Any]:
    return {
        "topic": result.topic,
        "route": str(result.route),
        "size": result.size,
        "sha256": result.sha256,
        "id": result.message_id,
        "url": result.url,
        "packets": result.packets,
    }


def _add_connection(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("connection (flags beat OFFLOAD_* and the config file)")
    group.add_argument("--broker", help="mqtt[s]://[user:pass@]host[:port]")
    group.add_argument("--username")
    group.add_argument("--password")
    group.add_argument("--protocol", choices=["5", "3.1.1"], help="MQTT version (default 5)")
    group.add_argument("--client-id")
    group.add_argument("--endpoint", help="offload gateway URL (skips discovery)")
    group.add_argument("--discovery-topic")
    group.add_argument("--discovery-wait", type=float, metavar="SECONDS")
    group.add_argument("--max-packet-size", type=int, metavar="BYTES")
    group.add_argument("--offload-threshold", type=int, metavar="BYTES")
    group.add_argument("--chunk-timeout", type=float, metavar="SECONDS")
    onoff = argparse.BooleanOptionalAction
    group.add_argument("--automatic-offload", action=onoff, default=None)
    group.add_argument("--fetch-external", action=onoff, default=None)
    group.add_argument("--chunking", action=onoff, default=None)


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="offload",
        description="MQTT messages of any size: offload to an HTTP gateway, else ADR-23 chunks.",
        epilog=EXIT_CODES_EPILOG,
    )
    parser.add_argument("--config", metavar="FILE", help="TOML config file")
    parser.add_argument("-v", "--verbose", action="count", default=0)
    sub = parser.add_subparsers(dest="command", required=True)

    pub = sub.add_parser("publish", help="publish a file or a text message")
    _add_connection(pub)
    pub.add_argument("--topic", "-t", required=True)
    what = pub.add_mutually_exclusive_group(required=True)
    what.add_argument("--file", "-f", type=Path, help="payload file ('-' for stdin)")
    what.add_argument("--message", "-m", help="payload text (UTF-8)")
    pub.add_argument("--qos", "-q", type=int, choices=[0, 1, 2], default=1)
    pub.add_argument("--retain", "-r", action="store_true")

    subs = sub.add_parser("subscribe", help="print one JSON line per message")
    _add_connection(subs)
    subs.add_argument("--topic", "-t", required=True, action="append", help="filter (repeatable)")
    subs.add_argument("--qos", "-q", type=int, choices=[0, 1, 2], default=1)
    subs.add_argument("--count", "-c", type=int, help="stop after N messages (errors count)")
    subs.add_argument("--timeout", type=float, metavar="SECONDS", help="stop when idle this long")
    subs.add_argument("--out", "-o", type=Path, metavar="DIR", help="write payloads here")

    fetch = sub.add_parser("fetch", help="download an offloaded payload")
    fetch.add_argument("url", help="{endpoint}/msg/{id} (its raw /payload is fetched) or any URL")
    fetch.add_argument("-o", "--output", type=Path, help="file to write (default: stdout)")
    fetch.add_argument("--sha256", help="expected SHA-256 (hex) to verify")

    up = sub.add_parser("upload", help="resumable upload of a file (tus); the gateway publishes it")
    up.add_argument("--endpoint", required=True, help="offload gateway URL")
    up.add_argument("--topic", "-t", required=True)
    up.add_argument("--file", "-f", type=Path, required=True)
    up.add_argument("--resume", action="store_true", help="continue this file's last upload")
    up.add_argument("--content-type", help="the message's content type")
    up.add_argument("--segment-size", type=int, default=8 << 20, metavar="BYTES")
    up.add_argument("--username", help="gateway login (SCRAM), default: OFFLOAD_USERNAME")
    up.add_argument("--password")
    up.add_argument("--state-dir", type=Path, help="where upload URLs are remembered")

    disc = sub.add_parser("discover", help="print the advertised discovery record")
    _add_connection(disc)
    disc.add_argument("--timeout", type=float, default=5.0, metavar="SECONDS")
    return parser


_SETTING_FLAGS = (
    "broker", "username", "password", "client_id", "endpoint", "discovery_topic",
    "discovery_wait", "max_packet_size", "offload_threshold", "chunk_timeout",
    "automatic_offload", "fetch_external", "chunking",
)  # fmt: skip


def settings_from_args(args: argparse.Namespace) -> ClientSettings:
    """Flags > environment > config file > defaults."""
    flags: dict[str, object] = {name: getattr(args, name, None) for name in _SETTING_FLAGS}
    if getattr(args, "protocol", None):
        flags["protocol"] = 4 if args.protocol == "3.1.1" else 5
    return load_settings(flags, environ=os.environ, config_file=args.config)


def _publish(args: argparse.Namespace) -> int:
    settings = settings_from_args(args)
    with Client(settings=settings) as client:
        if args.file is not None:
            if str(args.file) == "-":
                result = client.publish(
                    args.topic, sys.stdin.buffer, qos=args.qos, retain=args.retain
                )
            elif args.file.stat().st_size >= PROGRESS_MIN_BYTES:
                # Two passes over the file: the SHA-256, then the upload or the chunks.
                size = args.file.stat().st_size
                with args.file.open("rb") as raw, Progress(2 * size, label="publish") as bar:
                    reader = cast(BinaryIO, CountingReader(raw, bar))
                    result = client.publish(args.topic, reader, qos=args.qos, retain=args.retain)
            else:
                result = client.publish(args.topic, args.file, qos=args.qos, retain=args.retain)
        else:
            result = client.publish(args.topic, args.message, qos=args.qos, retain=args.retain)
    _emit(_result_doc(result))
    return EXIT_OK


def _safe_name(topic: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in topic)[:100]


def _subscribe(args: argparse.Namespace) -> int:
    settings = settings_from_args(args)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
    errors = 0
    seen = 0
    bars: dict[str, Progress] = {}

    def progress(topic: str, done: int, total: int | None) -> None:
        # A bar only for large payloads, and only on a terminal (Progress decides).
        if total is None or total < PROGRESS_MIN_BYTES:
            return
        bar = bars.get(topic)
        if bar is None:
            bar = bars[topic] = Progress(total, label=f"fetch {topic}")
        bar.update(done - bar.done)
        if done >= total:
            bars.pop(topic).close()

    with Client(settings=settings, on_fetch_progress=progress) as client:
        for topic_filter in args.topic:
            client.subscribe(topic_filter, args.qos)
        for item in client.messages(timeout=args.timeout):
            seen += 1
            if isinstance(item, MessageError):
                errors += 1
                _emit({
                    "topic": item.topic,
                    "error": cause(item.error),
                    "id": item.message_id,
                    "detail": detail(item.error),
                })  # fmt: skip
            else:
                _emit(_message_doc(item, args.out, seen))
            if args.count is not None and seen >= args.count:
                break
    return EXIT_ERRORS if errors else EXIT_OK


def _message_doc(msg: Message, out: Path | None, seq: int) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "topic": msg.topic,
        "size": msg.size,
        "sha256": msg.sha256,
        "route": str(msg.route),
        "qos": msg.qos,
        "retain": msg.retain,
        "id": msg.message_id,
    }
    p = msg.properties
    if p.content_type is not None:
        doc["content_type"] = p.content_type
    if p.user_properties:
        doc["user_properties"] = [list(pair) for pair in p.user_properties]
    if out is not None:
        path = out / f"{seq:06d}-{_safe_name(msg.topic)}"
        msg.body.save(path)
        doc["file"] = str(path)
    return doc


def _fetch(args: argparse.Namespace) -> int:
    if args.output is not None and args.output.is_dir():
        # Before any download: a directory cannot become the file.
        raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(args.output))
    url: str = args.url.rstrip("/")
    last = url.rsplit("/", 1)[-1]
    try:
        MessageId.parse(last)
        if url.rsplit("/", 2)[-2] == "msg":
            url += "/payload"  # the raw bytes, not the BSON document
    except ValueError:
        pass
    with HttpTransport() as transport:
        if args.sha256:  # verified and spooled inside the transport: no bar to feed
            payload = transport.fetch(url, expected_sha256=args.sha256.lower())
            if args.output is not None:
                payload.save(args.output)
            else:
                with payload.open() as f:
                    while piece := f.read(1 << 20):
                        sys.stdout.buffer.write(piece)
            size = payload.size
        else:
            # The bar goes to stderr, so `offload fetch URL > file` on a terminal shows it too.
            with Progress(_content_length(url), label="fetch") as bar:
                if args.output is not None:
                    with _replacing(args.output) as out:
                        size = transport.fetch_to(url, cast(BinaryIO, CountingWriter(out, bar)))
                else:
                    sink = cast(BinaryIO, CountingWriter(sys.stdout.buffer, bar))
                    size = transport.fetch_to(url, sink)
    if args.output is not None:
        _emit({"url": url, "size": size, "file": str(args.output)})
    return EXIT_OK


@contextlib.contextmanager
def _replacing(path: Path) -> Iterator[BinaryIO]:
    """Write to a temporary file beside `path`, renamed over it only on success.

    A failed download leaves no empty or truncated file and never clobbers an earlier one.
    """
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".part", dir=path.parent)
    except OSError as exc:  # name the user's file, not the hidden temporary one
        raise OSError(exc.errno, exc.strerror, str(path)) from None
    try:
        with os.fdopen(fd, "wb") as out:
            yield out
        os.replace(tmp, path)
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        raise OSError(exc.errno, exc.strerror, str(path)) from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _content_length(url: str) -> int | None:
    """The payload's size for the progress bar's ETA; None when the server does not say."""
    if not sys.stderr.isatty():
        return None
    try:
        length = httpx.head(url, timeout=10).headers.get("content-length")
    except httpx.HTTPError:
        return None
    return int(length) if length and length.isdigit() else None


def _upload(args: argparse.Namespace) -> int:
    settings = settings_from_args(args)
    auth = gateway_auth(
        username=settings.username, password=settings.password, token=settings.http_token
    )
    size = args.file.stat().st_size
    bar = Progress(size, label="upload")

    with httpx.Client(auth=auth, timeout=120) as http, bar:
        uploader = TusUploader(
            http, args.endpoint, state_dir=args.state_dir, segment=args.segment_size
        )
        try:
            result = uploader.upload(
                args.file,
                args.topic,
                resume=args.resume,
                content_type=args.content_type,
                on_bytes=bar.update,
                on_start=bar.restart_from,
            )
        except (UploadError, KeyboardInterrupt) as exc:
            remembered = state_path(uploader.state_dir, args.file, uploader.endpoint, args.topic)
            if not remembered.exists():  # nothing acknowledged yet: nothing to resume
                raise
            bar.close()
            code, line = describe(exc)
            print(f"{line}; the same command with --resume continues", file=sys.stderr)
            return code
    _emit({
        "topic": args.topic,
        "id": result.message_id,
        "url": result.url,
        "size": result.size,
        "sha256": result.sha256,
        "resumed_from": result.resumed_from,
    })  # fmt: skip
    return EXIT_OK


def _discover(args: argparse.Namespace) -> int:
    settings = settings_from_args(args)
    if settings.endpoint is not None:
        raise ConfigError("discover asks the broker: do not pass --endpoint")
    with Client(settings=settings) as client:
        deadline = time.monotonic() + args.timeout
        client.wait_for_endpoint(args.timeout)
        record = client.discovery_record
        while record is None and time.monotonic() < deadline:
            time.sleep(0.05)
            record = client.discovery_record
    if record is None:
        _emit({"topic": settings.discovery_topic, "error": "no discovery record"})
        return EXIT_ERRORS
    doc = json.loads(record.to_json())
    doc["topic"] = settings.discovery_topic
    _emit(doc)
    return EXIT_OK


_COMMANDS = {
    "publish": _publish,
    "subscribe": _subscribe,
    "fetch": _fetch,
    "upload": _upload,
    "discover": _discover,
}


def _http_url(prog: str, flag: str, url: str) -> None:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise UsageError(prog, f"{flag} must be an http:// or https:// URL, got {url!r}")
    try:
        parts.port  # noqa: B018  (raises on a bad port)
    except ValueError:
        raise UsageError(prog, f"{flag} has a bad port: {url!r}") from None


def _base_url(prog: str, url: str) -> None:
    """An endpoint is the gateway's base URL; an API path there only earns a redirect."""
    _http_url(prog, "--endpoint", url)
    last = urlsplit(url).path.rstrip("/").rsplit("/", 1)[-1]
    if last in ("msg", "topic", "uploads", "publish", "docs"):
        raise UsageError(
            prog, f"--endpoint is the gateway's base URL (http://HOST:PORT), not /{last}: {url!r}"
        )


def _readable(prog: str, file: Path) -> None:
    if str(file) != "-" and not file.is_file():
        reason = "is a directory" if file.is_dir() else "no such file"
        raise UsageError(prog, f"cannot read {file}: {reason}")


def validate(args: argparse.Namespace) -> None:
    """Every argument checked before anything connects, so a typo is exit 2, not 3 or 5.

    Raises:
        UsageError: naming the subcommand whose argument is wrong.
    """
    prog = f"offload {args.command}"
    try:
        if args.command in ("publish", "upload"):
            Topic(args.topic)
        if args.command == "subscribe":
            for topic_filter in args.topic:
                TopicFilter(topic_filter)
    except InvalidTopic as exc:
        raise UsageError(prog, str(exc)) from None
    if getattr(args, "file", None) is not None:
        _readable(prog, args.file)
    if args.command == "fetch":
        _http_url(prog, "the URL", args.url)
        if args.output is not None and not args.output.parent.is_dir():
            raise UsageError(prog, f"cannot write {args.output}: no such directory")
    if args.command == "upload":
        _base_url(prog, args.endpoint)
        if args.segment_size <= 0:
            raise UsageError(prog, "--segment-size must be positive")
    if args.command in ("publish", "subscribe", "discover"):
        try:
            settings = settings_from_args(args)
            BrokerUrl.parse(settings.broker)
        except ConfigError as exc:
            raise UsageError(prog, str(exc)) from None
        if settings.endpoint is not None:
            _base_url(prog, settings.endpoint)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the `offload` command line; returns the exit code.

    Args:
        argv: arguments without the program name (default: `sys.argv[1:]`).
    """
    try:
        args = build_parser().parse_args(argv)
        validate(args)
        level = [logging.WARNING, logging.INFO, logging.DEBUG][min(args.verbose, 2)]
        logging.basicConfig(
            level=level, format="offload: %(levelname)s %(message)s", stream=sys.stderr
        )
        return _COMMANDS[args.command](args)
    except (OffloadError, UsageError, OSError, KeyboardInterrupt) as exc:
        code, line = describe(exc)
        print(line, file=sys.stderr)
        return code


if __name__ == "__main__":
    sys.exit(main())
