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
import os
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, cast

from ._cli_args import build_parser, settings_from_args, validate
from ._cli_errors import EXIT_ERRORS, EXIT_OK, UsageError, cause, describe, detail
from ._exceptions import ConfigError, OffloadError, UploadError

if TYPE_CHECKING:
    from ._message import Message, PublishResult

# Start-up is paid by every `offload publish` in a shell loop, so this module imports only
# argument parsing and error reporting. Each command imports what it uses when it runs:
# httpx only for a transfer, paho only to connect, scramp only for a SCRAM login
# (tests/test_cli_startup.py keeps it so; bench/startup.py measures it).

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


def _publish(args: argparse.Namespace) -> int:
    from ._client import Client
    from ._progress import CountingReader, Progress

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
    import dataclasses

    from ._client import Client
    from ._message import MessageError
    from ._progress import Progress

    settings = settings_from_args(args)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        if settings.spool_dir is None:
            # Spooled in DIR, a large payload is renamed into place, never copied, and never
            # held in a /tmp that is memory (tmpfs).
            settings = dataclasses.replace(settings, spool_dir=str(args.out))
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
    from ._http import HttpTransport
    from ._progress import CountingWriter, Progress
    from .protocol import MessageId

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
    if args.range is not None:  # client/_cli_range.py: only the chunks the range needs
        from ._cli_crypt import fetch_range

        files = () if args.raw else settings_from_args(args).identity_files
        return fetch_range(args, url, _emit, files)
    # Encrypted or compressed stored bytes are decoded (client/_cli_crypt.py); --raw: as is.
    decoded, decoding = _crypt_hooks(args)
    with HttpTransport() as transport:
        if args.sha256:  # verified and spooled inside the transport: no bar to feed
            payload = transport.fetch(
                url, expected_sha256=args.sha256.lower(), redirect_ok=_anywhere
            )
            payload = decoded(payload)  # after the stored bytes' SHA-256 was checked
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
                    with _replacing(args.output) as stored, decoding(stored) as out:
                        size = transport.fetch_to(
                            url, cast(BinaryIO, CountingWriter(out, bar)), redirect_ok=_anywhere
                        )
                else:
                    with decoding(sys.stdout.buffer) as out:
                        sink = cast(BinaryIO, CountingWriter(out, bar))
                        size = transport.fetch_to(url, sink, redirect_ok=_anywhere)
    if args.output is not None:
        _emit({"url": url, "size": size, "file": str(args.output)})
    return EXIT_OK


def _crypt_hooks(args: argparse.Namespace) -> tuple[Any, Any]:
    from ._cli_crypt import decoding_hooks

    return decoding_hooks(args, settings_from_args(args))


def _anywhere(origin: object) -> bool:
    """`offload fetch URL` follows redirects like `curl -L`: it sends no credentials at all,
    and the user named the URL (a gateway with direct transfers redirects to its store)."""
    return True


@contextlib.contextmanager
def _replacing(path: Path) -> Iterator[BinaryIO]:
    """Write to a temporary file beside `path`, renamed over it only on success.

    A failed download leaves no empty or truncated file and never clobbers an earlier one.
    """
    import tempfile

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
    import httpx

    try:
        length = httpx.head(url, timeout=10).headers.get("content-length")
    except httpx.HTTPError:
        return None
    return int(length) if length and length.isdigit() else None


def _upload(args: argparse.Namespace) -> int:
    import httpx

    from ._progress import Progress
    from ._scram import gateway_auth
    from ._upload import TusUploader, state_path

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
    from ._client import Client

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


# Optional imports of our libraries that no `offload` command uses, paid at every start
# (30-100 ms each on 2 cores): httpx's own command line (rich, click and pygments, where they
# are installed) and paho's DNS SRV lookup (dnspython, which pymongo always installs; we
# never call `connect_srv`). None in sys.modules makes their `try: import ... except
# ImportError` take its fallback at once. Only in the `offload` process itself, never in an
# application that imports this module.
_UNUSED_OPTIONAL_IMPORTS = ("httpx._main", "dns.resolver")


def _skip_unused_optional_imports() -> None:
    for name in _UNUSED_OPTIONAL_IMPORTS:
        sys.modules.setdefault(name, None)  # type: ignore[arg-type]


def _keygen(args: argparse.Namespace) -> int:
    from ._cli_crypt import keygen

    return keygen(args)


_COMMANDS = {
    "keygen": _keygen,
    "publish": _publish,
    "subscribe": _subscribe,
    "fetch": _fetch,
    "upload": _upload,
    "discover": _discover,
}


def main(argv: Sequence[str] | None = None) -> int:
    """Run the `offload` command line; returns the exit code.

    Args:
        argv: arguments without the program name (default: `sys.argv[1:]`, and then this
            is the `offload` process: the optional imports no command uses are skipped).
    """
    if argv is None:
        _skip_unused_optional_imports()
    try:
        args = build_parser().parse_args(argv)
        validate(args)
        import logging

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
