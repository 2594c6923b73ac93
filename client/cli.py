"""`offload`: publish, subscribe, fetch and discover from the command line.

Settings are layered defaults < config file < environment (`OFFLOAD_*`) < flags, see
:mod:`client.config._settings`. Output is machine-readable: one JSON line per message with the same
leading keys for every command (`topic`, `id`, `size`, `sha256`, `route`, `url`, see
:mod:`client.commands._output`), or per error (`error` names the cause: `checksum mismatch`,
`chunk timeout`, `not found`, `access refused`, ...). `fetch` and `upload` are in
:mod:`client.commands._http`.

Errors are one line on stderr and a stable exit code per class; the table is in
:mod:`client.commands._errors` and docs/cli.md.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, cast

from .commands._args import build_parser, settings_from_args, validate
from .commands._errors import (
    EXIT_ERRORS,
    EXIT_OK,
    EXIT_PIPE,
    StdoutClosed,
    UsageError,
    cause,
    describe,
    detail,
    refused,
)
from .commands._http import fetch_command, upload_command
from .commands._output import emit, message_line
from .core._exceptions import OffloadError

if TYPE_CHECKING:
    from .core._message import Message, PublishResult

# Start-up is paid by every `offload publish` in a shell loop, so this module imports only
# argument parsing and error reporting. Each command imports what it uses when it runs:
# httpx only for a transfer, paho only to connect, scramp only for a SCRAM login
# (tests/test_cli_startup.py keeps it so; bench/startup.py measures it).

PROGRESS_MIN_BYTES = 8 << 20  # smaller files finish before a bar is worth drawing

__all__ = ["build_parser", "cause", "main"]


def _result_doc(result: PublishResult, args: argparse.Namespace) -> dict[str, Any]:
    return message_line(
        topic=result.topic,
        message_id=result.message_id,
        size=result.size,
        sha256=result.sha256,
        route=str(result.route),
        url=result.url,
        qos=args.qos,
        retain=args.retain and str(result.route) != "chunked",  # chunks are never retained
        packets=result.packets,
    )


def _publish(args: argparse.Namespace) -> int:
    from ._client import Client
    from .commands._progress import PassReader, Progress

    settings = settings_from_args(args)
    with Client(settings=settings, tracer_provider=args.tracing) as client:
        if args.file is None:
            result = client.publish(args.topic, args.message, qos=args.qos, retain=args.retain)
        elif str(args.file) == "-":
            result = client.publish(args.topic, sys.stdin.buffer, qos=args.qos, retain=args.retain)
        elif (size := args.file.stat().st_size) >= PROGRESS_MIN_BYTES:
            # The file is read twice (its SHA-256, then the upload or the chunks): the bar
            # shows each pass against the file's size, never the sum of both.
            with args.file.open("rb") as raw, Progress(size, label="publish") as bar:
                reader = cast(BinaryIO, PassReader(raw, bar, size))
                result = client.publish(args.topic, reader, qos=args.qos, retain=args.retain)
        else:
            result = client.publish(args.topic, args.file, qos=args.qos, retain=args.retain)
    emit(_result_doc(result, args))
    return EXIT_OK


def _safe_name(topic: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in topic)[:100]


def _subscribe(args: argparse.Namespace) -> int:
    import dataclasses

    from ._client import Client
    from .commands._progress import Progress
    from .core._message import MessageError

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

    with Client(
        settings=settings, on_fetch_progress=progress, tracer_provider=args.tracing
    ) as client:
        for topic_filter in args.topic:
            client.subscribe(topic_filter, args.qos)
        for item in client.messages(timeout=args.timeout, report_unfinished=True):
            seen += 1
            if isinstance(item, MessageError):
                errors += 1
                emit({
                    "topic": item.topic,
                    "error": cause(item.error),
                    "id": item.message_id,
                    "detail": detail(item.error),
                })  # fmt: skip
                if refused(item.error):
                    # The login is wrong (or the ACL says no): every later placeholder would
                    # fail alike. Stop, and say so as every command does (exit 6).
                    raise item.error
            else:
                emit(_message_doc(item, args.out, seen))
            if args.count is not None and seen >= args.count:
                break
    if args.count is not None and seen < args.count:
        # Asked for N messages and the wait ran out: a failure a script must see.
        ended = "the subscription ended" if args.timeout is None else "--timeout ran out"
        print(f"offload: {seen} of {args.count} messages before {ended}", file=sys.stderr)
        return EXIT_ERRORS
    return EXIT_ERRORS if errors else EXIT_OK


def _message_doc(msg: Message, out: Path | None, seq: int) -> dict[str, Any]:
    doc = message_line(
        topic=msg.topic,
        message_id=msg.message_id,
        size=msg.size,
        sha256=msg.sha256,
        route=str(msg.route),
        url=None,
        qos=msg.qos,
        retain=msg.retain,
    )
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


def _discover(args: argparse.Namespace) -> int:
    import dataclasses

    from ._client import Client

    # It asks the broker whatever endpoint OFFLOAD_ENDPOINT or the config file names (one
    # there would skip discovery), and it never moves a payload: nothing to switch off.
    settings = dataclasses.replace(
        settings_from_args(args), endpoint=None, automatic_offload=True, fetch_external=True
    )
    with Client(settings=settings) as client:
        deadline = time.monotonic() + args.timeout
        client.wait_for_endpoint(args.timeout)
        record = client.discovery_record
        while record is None and client.discovery_refused is None and time.monotonic() < deadline:
            time.sleep(0.05)
            record = client.discovery_record
    if record is None:
        why = client.discovery_refused or "no discovery record"
        emit({"topic": settings.discovery_topic, "error": why})
        return EXIT_ERRORS
    doc = json.loads(record.to_json())
    doc["topic"] = settings.discovery_topic
    emit(doc)
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
    from .commands._crypt import keygen

    return keygen(args)


def _usage(args: argparse.Namespace) -> int:
    from .commands._http import _gateway_login
    from .commands._lifecycle import usage_command

    settings = settings_from_args(args)
    return usage_command(args, settings, _gateway_login(settings))


#: The commands that move messages: traced (client/commands/_trace.py).
_TRACED = frozenset({"publish", "subscribe", "fetch", "upload"})

_COMMANDS = {
    "keygen": _keygen,
    "publish": _publish,
    "subscribe": _subscribe,
    "fetch": fetch_command,
    "upload": upload_command,
    "discover": _discover,
    "usage": _usage,
}


def _discard_stdout() -> None:
    """Point stdout at /dev/null: what is still buffered for the closed pipe is dropped
    quietly at exit (Python would report the failed flush), as the Python docs advise."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):  # stdout is not a file here (main() called by a test)
        pass


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
        if args.command not in _TRACED:
            return _COMMANDS[args.command](args)
        from .commands._trace import command_tracing

        with command_tracing(os.environ) as args.tracing:
            return _COMMANDS[args.command](args)
    except StdoutClosed:
        _discard_stdout()
        return EXIT_PIPE
    except (OffloadError, UsageError, OSError, KeyboardInterrupt) as exc:
        code, line = describe(exc)
        print(line, file=sys.stderr)
        return code


if __name__ == "__main__":
    sys.exit(main())
