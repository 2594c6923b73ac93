"""The `offload` command line's arguments: the parser, the settings they make, their checks.

Every argument is checked here before a command connects anywhere, so a mistyped topic or
URL is a usage error (exit 2) whatever state the broker or gateway is in. The checks import
their modules when they run: `offload --help` and a usage error load no codec or setting.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from . import _cli_crypt as crypt
from ._cli_errors import EXIT_CODES_EPILOG, Parser, UsageError
from ._exceptions import ConfigError, InvalidTopic

if TYPE_CHECKING:
    from ._config import ClientSettings


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
    crypt.add_publish_flags(pub)

    subs = sub.add_parser("subscribe", help="print one JSON line per message")
    _add_connection(subs)
    subs.add_argument("--topic", "-t", required=True, action="append", help="filter (repeatable)")
    subs.add_argument("--qos", "-q", type=int, choices=[0, 1, 2], default=1)
    subs.add_argument("--count", "-c", type=int, help="stop after N messages (errors count)")
    subs.add_argument("--timeout", type=float, metavar="SECONDS", help="stop when idle this long")
    subs.add_argument("--out", "-o", type=Path, metavar="DIR", help="write payloads here")
    subs.add_argument(
        "--ordering", choices=["topic", "arrival"], help="per-topic (default) or arrival order"
    )
    subs.add_argument("--fetch-concurrency", type=int, metavar="N", help="fetches at once (4)")
    crypt.add_identity_flags(subs)

    fetch = sub.add_parser("fetch", help="download an offloaded payload")
    fetch.add_argument("url", help="{endpoint}/msg/{id} (its raw /payload is fetched) or any URL")
    fetch.add_argument("-o", "--output", type=Path, help="file to write (default: stdout)")
    fetch.add_argument("--sha256", help="expected SHA-256 (hex) to verify")
    crypt.add_identity_flags(fetch, raw=True)

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
    crypt.add_keygen(sub)
    return parser


_SETTING_FLAGS = (
    "broker", "username", "password", "client_id", "endpoint", "discovery_topic",
    "discovery_wait", "max_packet_size", "offload_threshold", "chunk_timeout",
    "automatic_offload", "fetch_external", "chunking", "ordering", "fetch_concurrency",
)  # fmt: skip


def settings_from_args(args: argparse.Namespace) -> ClientSettings:
    """Flags > environment > config file > defaults."""
    from ._config import load_settings  # not for `--help` or `fetch`: tomllib and friends

    flags: dict[str, object] = {name: getattr(args, name, None) for name in _SETTING_FLAGS}
    flags.update(crypt.setting_flags(args))
    if getattr(args, "protocol", None):
        flags["protocol"] = 4 if args.protocol == "3.1.1" else 5
    return load_settings(flags, environ=os.environ, config_file=args.config)


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
    from .protocol import Topic, TopicFilter  # dataclasses and uuid: not for `--help`

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
        from ._broker import BrokerUrl

        try:
            settings = settings_from_args(args)
            BrokerUrl.parse(settings.broker)
        except ConfigError as exc:
            raise UsageError(prog, str(exc)) from None
        if settings.endpoint is not None:
            _base_url(prog, settings.endpoint)
