"""The `offload` command line's retention parts: a consumer group, dedup, and `usage`.

    offload subscribe -t 'cams/#' --group archive   # confirms each verified payload
    offload publish -t T -f F [--no-dedup]          # asks the gateway first (default)
    offload usage [--endpoint URL]                  # the account's stored bytes and quota

`usage` prints one JSON line: `user`, `stored_bytes`, `held_bytes` (uploads in flight),
`limit_bytes` (the gateway's OFFLOAD_MAX_STORED_BYTES_PER_USER), `counted` (false when the
gateway keeps no quota, and counts nothing). docs/cli.md has the commands,
docs/operations.md what the gateway keeps.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from ._errors import EXIT_OK

if TYPE_CHECKING:
    import httpx

    from ..config._settings import ClientSettings


def add_group_flag(parser: argparse.ArgumentParser) -> None:
    """`--group`, for the command that receives (`subscribe`)."""
    parser.add_argument(
        "--group",
        metavar="NAME",
        help="consumer group to confirm verified payloads for (default OFFLOAD_GROUP)",
    )


def add_dedup_flag(parser: argparse.ArgumentParser) -> None:
    """`--dedup/--no-dedup`, for the command that uploads (`publish`)."""
    parser.add_argument(
        "--dedup",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="ask the gateway by SHA-256 first: a payload the account stores is not sent again "
        "(default: on)",
    )


def add_usage(sub: Any, add_login: Any, add_global: Any) -> None:
    """The `usage` subcommand on `sub`, with the gateway login flags."""
    usage = sub.add_parser("usage", help="print the account's stored bytes and its quota")
    add_global(usage, sub=True)
    login = usage.add_argument_group("gateway (flags beat OFFLOAD_* and the config file)")
    login.add_argument(
        "--endpoint", help="gateway base URL; default OFFLOAD_ENDPOINT, else OFFLOAD_PUBLIC_URL"
    )
    add_login(login, gateway_only=True)


def setting_flags(args: argparse.Namespace) -> dict[str, object]:
    """The settings these flags set (None: not given, the lower layers decide)."""
    return {"group": getattr(args, "group", None), "dedup": getattr(args, "dedup", None)}


def usage_command(
    args: argparse.Namespace, settings: ClientSettings, auth: httpx.Auth | None
) -> int:
    """`offload usage`: `GET /usage` (`settings` as the flags, environment and config file
    make them; `auth`: the command line's gateway login)."""
    from ..http._retention import read_usage
    from ..http._transport import HttpTransport
    from ._output import emit

    verify = settings.tls_files.http_verify()
    with HttpTransport(timeout=settings.http_timeout, verify=verify) as transport:
        doc = read_usage(transport.client, args.endpoint, auth=auth)
    emit({key: doc.get(key) for key in USAGE_KEYS})
    return EXIT_OK


USAGE_KEYS = ("user", "counted", "stored_bytes", "held_bytes", "limit_bytes")
