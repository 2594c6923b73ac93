"""The `offload` command line's arguments: the parser, the settings they make, their checks.

Every argument is checked here before a command connects anywhere, so a mistyped topic or
URL is a usage error (exit 2) whatever state the broker or gateway is in. The checks import
their modules when they run: `offload --help` and a usage error load no codec or setting.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from ..core._exceptions import ConfigError, InvalidTopic
from . import _crypt as crypt
from . import _lifecycle as lifecycle
from ._errors import EXIT_CODES_EPILOG, Parser, UsageError
from ._numbers import MAX_INTERVAL, MAX_PACKET, seconds, whole

if TYPE_CHECKING:
    from ..config._settings import ClientSettings
    from ..protocol import Placeholder

_ONOFF = argparse.BooleanOptionalAction


class _Version(argparse.Action):
    """`--version`: the installed package's version, looked up only when asked."""

    def __init__(self, option_strings: list[str], dest: str, **kwargs: object) -> None:
        super().__init__(option_strings, dest, nargs=0, help="print the version and exit")

    def __call__(self, parser: argparse.ArgumentParser, *args: object) -> None:
        from importlib.metadata import PackageNotFoundError, version

        try:
            number = version("mqtt-offload")
        except PackageNotFoundError:
            number = "unknown (not installed)"
        print(f"offload {number}")  # on stdout, as argparse's own version action does
        parser.exit()


def _add_global(parser: argparse.ArgumentParser, *, sub: bool) -> None:
    """`--config` and `-v`, accepted before and after the subcommand.

    After it, they are left out of the namespace unless given (SUPPRESS), so they never reset
    what was given before it.
    """
    parser.add_argument(
        "--config",
        metavar="FILE",
        help="TOML config file",
        default=argparse.SUPPRESS if sub else None,
    )
    parser.add_argument(
        "-v",
        "--verbose",
        action="count",
        help="more log lines",
        default=argparse.SUPPRESS if sub else 0,
    )


def _add_login(group: argparse._ArgumentGroup, *, gateway_only: bool = False) -> None:
    who = "gateway login (SCRAM)" if gateway_only else "broker login, also the gateway's"
    group.add_argument("--username", help=f"{who}; default OFFLOAD_USERNAME")
    group.add_argument("--password", help="its password; default OFFLOAD_PASSWORD")


def _add_broker(parser: argparse.ArgumentParser) -> argparse._ArgumentGroup:
    """The flags every command that connects to the broker takes."""
    group = parser.add_argument_group("connection (flags beat OFFLOAD_* and the config file)")
    group.add_argument("--broker", help="mqtt[s]://[user:pass@]host[:port]")
    _add_login(group)
    group.add_argument("--protocol", choices=["5", "3.1.1"], help="MQTT version (default 5)")
    group.add_argument("--client-id")
    group.add_argument(
        "--session-expiry",
        type=whole(0, MAX_INTERVAL),
        metavar="SECONDS",
        help="persistent session; needs --client-id",
    )
    group.add_argument("--cert-file", metavar="PEM", help="client certificate (mutual TLS)")
    group.add_argument("--key-file", metavar="PEM", help="its private key")
    group.add_argument("--key-password", help="password of an encrypted --key-file")
    group.add_argument("--will-topic", help="Will sent by the broker if this process vanishes")
    group.add_argument("--will-payload", metavar="TEXT", help="the Will's payload")
    group.add_argument("--will-qos", type=int, choices=[0, 1, 2])
    group.add_argument("--will-retain", action=argparse.BooleanOptionalAction, default=None)
    group.add_argument(
        "--will-delay", type=whole(0, MAX_INTERVAL), metavar="SECONDS", help="MQTT 5 Will Delay"
    )
    group.add_argument("--discovery-topic")
    return group


def _add_gateway(group: argparse._ArgumentGroup) -> None:
    """The flags of the commands that move payloads (publish, subscribe)."""
    group.add_argument("--endpoint", help="offload gateway URL (skips discovery)")
    group.add_argument("--discovery-wait", type=seconds(zero=True), metavar="SECONDS")
    group.add_argument("--max-packet-size", type=whole(1, MAX_PACKET), metavar="BYTES")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="offload",
        description="MQTT messages of any size: offload to an HTTP gateway, else ADR-23 chunks.",
        epilog=EXIT_CODES_EPILOG,
    )
    parser.add_argument("--version", action=_Version)
    _add_global(parser, sub=False)
    sub = parser.add_subparsers(dest="command", required=True)
    for add in (_add_publish, _add_subscribe, _add_fetch, _add_upload, _add_discover):
        add(sub)
    crypt.add_keygen(sub)
    lifecycle.add_usage(sub, _add_login, _add_global)
    return parser


def _add_publish(sub: Any) -> None:
    pub = sub.add_parser("publish", help="publish a file or a text message")
    _add_global(pub, sub=True)
    group = _add_broker(pub)
    _add_gateway(group)
    group.add_argument("--offload-threshold", type=whole(1), metavar="BYTES")
    group.add_argument("--automatic-offload", action=_ONOFF, default=None)
    group.add_argument("--chunking", action=_ONOFF, default=None)
    group.add_argument(
        "--fallback-on-auth-failure",
        action=_ONOFF,
        default=None,
        help="chunk or publish directly when the gateway refuses the login (default: exit 6)",
    )
    pub.add_argument("--topic", "-t", required=True)
    what = pub.add_mutually_exclusive_group(required=True)
    what.add_argument("--file", "-f", type=Path, help="payload file ('-' for stdin)")
    what.add_argument("--message", "-m", help="payload text (UTF-8)")
    pub.add_argument("--qos", "-q", type=int, choices=[0, 1, 2], default=1)
    pub.add_argument("--retain", "-r", action="store_true")
    crypt.add_publish_flags(pub)
    lifecycle.add_dedup_flag(pub)


def _add_subscribe(sub: Any) -> None:
    subs = sub.add_parser("subscribe", help="print one JSON line per message")
    _add_global(subs, sub=True)
    group = _add_broker(subs)
    _add_gateway(group)
    group.add_argument("--chunk-timeout", type=seconds(zero=False), metavar="SECONDS")
    group.add_argument("--fetch-external", action=_ONOFF, default=None)
    subs.add_argument("--topic", "-t", required=True, action="append", help="filter (repeatable)")
    subs.add_argument("--qos", "-q", type=int, choices=[0, 1, 2], default=1)
    subs.add_argument("--count", "-c", type=whole(1), help="stop after N messages (errors count)")
    subs.add_argument(
        "--timeout",
        type=seconds(zero=False),
        metavar="SECONDS",
        help="stop when idle this long (exit 1 if --count messages did not all come)",
    )
    subs.add_argument("--out", "-o", type=Path, metavar="DIR", help="write payloads here")
    subs.add_argument(
        "--ordering", choices=["topic", "arrival"], help="per-topic (default) or arrival order"
    )
    subs.add_argument("--fetch-concurrency", type=whole(1), metavar="N", help="fetches at once (4)")
    crypt.add_identity_flags(subs)
    lifecycle.add_group_flag(subs)


def _add_fetch(sub: Any) -> None:
    fetch = sub.add_parser("fetch", help="download an offloaded payload")
    _add_global(fetch, sub=True)
    fetch.add_argument(
        "url",
        nargs="?",
        help="{endpoint}/msg/{id} (its raw /payload is fetched), any URL, or a message id "
        "(on --endpoint, OFFLOAD_ENDPOINT or OFFLOAD_PUBLIC_URL); default: --placeholder's",
    )
    fetch.add_argument("-o", "--output", type=Path, help="file to write (default: stdout)")
    fetch.add_argument(
        "--sha256",
        metavar="HEX",
        help="the SHA-256 you hold: of the payload (as publish and subscribe print it) or of "
        "the stored bytes; nothing is written unless it matches",
    )
    fetch.add_argument(
        "--placeholder",
        metavar="FILE",
        type=Path,
        help="the placeholder you received: the stored bytes are checked against its size "
        "and sha256 and decoded as its enc/cmp say; nothing is written unless they match",
    )
    login = fetch.add_argument_group("gateway (flags beat OFFLOAD_* and the config file)")
    login.add_argument("--endpoint", help="gateway URL a message id is fetched from")
    _add_login(login, gateway_only=True)
    crypt.add_identity_flags(fetch, raw=True)


def _add_upload(sub: Any) -> None:
    up = sub.add_parser("upload", help="resumable upload of a file (tus); the gateway publishes it")
    _add_global(up, sub=True)
    up.add_argument("--topic", "-t", required=True)
    up.add_argument("--file", "-f", type=Path, required=True)
    up.add_argument(
        "--resume",
        action=_ONOFF,
        default=None,
        help="continue this file's unfinished upload (default); --no-resume starts over",
    )
    up.add_argument("--content-type", help="the message's content type")
    up.add_argument("--segment-size", type=whole(1), default=8 << 20, metavar="BYTES")
    up.add_argument("--state-dir", type=Path, help="where upload URLs are remembered")
    crypt.add_encrypt_flag(up)
    login = up.add_argument_group("gateway (flags beat OFFLOAD_* and the config file)")
    login.add_argument(
        "--endpoint", help="gateway base URL; default OFFLOAD_ENDPOINT, else OFFLOAD_PUBLIC_URL"
    )
    _add_login(login, gateway_only=True)


def _add_discover(sub: Any) -> None:
    disc = sub.add_parser("discover", help="print the advertised discovery record")
    _add_global(disc, sub=True)
    _add_broker(disc)
    disc.add_argument("--timeout", type=seconds(zero=False), default=5.0, metavar="SECONDS")


_SETTING_FLAGS = (
    "broker", "username", "password", "client_id", "endpoint", "discovery_topic",
    "discovery_wait", "max_packet_size", "offload_threshold", "chunk_timeout",
    "automatic_offload", "fetch_external", "chunking", "ordering", "fetch_concurrency",
    "fallback_on_auth_failure",
    "session_expiry", "cert_file", "key_file", "key_password",
    "will_topic", "will_payload", "will_qos", "will_retain", "will_delay",
)  # fmt: skip


def settings_from_args(args: argparse.Namespace) -> ClientSettings:
    """Flags > environment > config file > defaults."""
    from ..config._load import load_settings  # not for `--help`: tomllib and friends

    flags: dict[str, object] = {name: getattr(args, name, None) for name in _SETTING_FLAGS}
    flags.update(crypt.setting_flags(args))
    flags.update(lifecycle.setting_flags(args))
    if getattr(args, "protocol", None):
        flags["protocol"] = 4 if args.protocol == "3.1.1" else 5
    return load_settings(flags, environ=os.environ, config_file=args.config)


def gateway_endpoint(settings: ClientSettings) -> str | None:
    """The gateway `upload` and `fetch ID` talk to: `endpoint` (flag, OFFLOAD_ENDPOINT, config
    file), else `OFFLOAD_PUBLIC_URL`: the gateway's own URL, which `source .stack/env` sets.

    Only these two commands read it: `publish` and `subscribe` find the gateway on the
    discovery topic unless `endpoint` names one.
    """
    public = os.environ.get("OFFLOAD_PUBLIC_URL", "").strip()
    return settings.endpoint or public.rstrip("/") or None


def _http_url(prog: str, flag: str, url: str, *, alternative: str = "") -> None:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise UsageError(
            prog, f"{flag} must be an http:// or https:// URL{alternative}, got {url!r}"
        )
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
    from ..protocol import Topic, TopicFilter  # dataclasses and uuid: not for `--help`

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
        _fetch_flags(prog, args)
    try:
        settings = settings_from_args(args)
        if args.command in ("publish", "subscribe", "discover"):
            from ..mqtt._broker import BrokerUrl

            BrokerUrl.parse(settings.broker)
    except ConfigError as exc:
        raise UsageError(prog, str(exc)) from None
    if args.command in ("upload", "usage"):
        args.endpoint = _needed_endpoint(prog, settings, args.command)
        _base_url(prog, args.endpoint)
    elif args.command == "fetch" and args.url is not None:
        args.url = _fetch_url(prog, settings, args.url)
    elif args.command != "discover" and settings.endpoint is not None:
        _base_url(prog, settings.endpoint)


def _fetch_flags(prog: str, args: argparse.Namespace) -> None:
    """`offload fetch`'s own flags: what to fetch, how it is checked, where it goes.

    `--range` and `--placeholder` become values (`args.range`: `(start, end)`, half-open;
    `args.placeholder`: a :class:`client.protocol.Placeholder`).
    """
    if args.output is not None and not args.output.parent.is_dir():
        raise UsageError(prog, f"cannot write {args.output}: no such directory")
    if args.url is None and args.placeholder is None:
        raise UsageError(prog, "the URL (or message id) to fetch, or --placeholder FILE")
    if args.sha256 is not None:
        args.sha256 = args.sha256.strip().lower()
        if len(args.sha256) != 64 or any(c not in "0123456789abcdef" for c in args.sha256):
            raise UsageError(prog, f"--sha256 must be 64 hex digits, got {args.sha256!r}")
    if args.range is not None:
        if args.sha256 is not None or args.placeholder is not None:
            raise UsageError(
                prog,
                "--range cannot be checked: --sha256 and --placeholder cover the whole payload",
            )
        try:
            args.range = parse_range(args.range)
        except ValueError as exc:
            raise UsageError(prog, str(exc)) from None
    if args.placeholder is not None:
        args.placeholder = _placeholder_file(prog, args.placeholder)


def parse_range(text: str) -> tuple[int, int]:
    """`START-END` (inclusive, as HTTP writes it) as a half-open `(start, end)`.

    Raises:
        ValueError: not two non-negative integers with START <= END.
    """
    start, sep, end = text.partition("-")
    if not sep or not start.isdigit() or not end.isdigit() or int(start) > int(end):
        raise ValueError(f"--range must be START-END (bytes, inclusive), got {text!r}")
    return int(start), int(end) + 1


def _placeholder_file(prog: str, path: Path) -> Placeholder:
    """The placeholder in `path`: its JSON, as a subscriber receives it."""
    from ..protocol import MalformedPlaceholder, PublishProperties
    from ..protocol._placeholder import MAX_PLACEHOLDER_BYTES, parse

    _readable(prog, path)
    with path.open("rb") as f:
        data = f.read(MAX_PLACEHOLDER_BYTES + 1)
    try:
        return parse(data, PublishProperties())
    except MalformedPlaceholder as exc:
        raise UsageError(prog, f"--placeholder {path} is not a placeholder: {exc}") from None


def _needed_endpoint(prog: str, settings: ClientSettings, what: str) -> str:
    endpoint = gateway_endpoint(settings)
    if endpoint is None:
        raise UsageError(
            prog,
            f"{what} needs the gateway: --endpoint URL, OFFLOAD_ENDPOINT or OFFLOAD_PUBLIC_URL",
        )
    return endpoint


def _fetch_url(prog: str, settings: ClientSettings, url: str) -> str:
    """The URL to fetch: as given, or a bare message id on the gateway."""
    from ..protocol import MessageId

    try:
        MessageId.parse(url)
    except ValueError:
        _http_url(prog, "the URL", url, alternative=", or a message id (as publish prints it)")
        return url
    endpoint = _needed_endpoint(prog, settings, "a message id")
    _base_url(prog, endpoint)
    return f"{endpoint}/msg/{url}"
