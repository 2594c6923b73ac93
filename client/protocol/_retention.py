"""Retention by consumer group: group names and where confirmations live. Pure, no I/O.

A group's confirmation of one message is an object of its own, created only where none
exists, so the members of one group count once (docs/operations.md, "Retention by consumer
group")::

    acks/<message id>.<token>/<group>

`<token>` is the last segment of the message's own key (`Manifest.home`): an id may be
reused once its message expired, and the new message has a new token, so a confirmation
left over from the old one never counts for it. Shared by the gateway (confirm route,
sweeper) and the Spark source, which writes its confirmations straight into the store.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ._errors import ProtocolError
from ._types import MessageId

ACKS_PREFIX = "acks/"
#: Response header of the gateway's 413 when an upload would pass its account's stored-bytes
#: quota (its value: the setting's name), so that a refusal for the account's quota (which
#: deleting payloads gives back: offload-proxy answers PUBACK 0x97, Quota exceeded) is told
#: apart from a payload over the size limit (which the same PUBLISH always gets: 0x83).
QUOTA_HEADER = "x-offload-quota"
#: What a Spark stream's tasks verified, until the query commits the batch (then they
#: become confirmations): `acks-pending/<group>/<batch>/<task>.<written ms>.json`, a JSON
#: list of `<id>.<token>`. The gateway's sweeper deletes lists a day old (a batch never
#: committed; one replayed later writes its lists again).
PENDING_PREFIX = "acks-pending/"
#: A group name: what a key segment, a header value and a TOML key all hold as they are.
GROUP_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
_TOKEN = re.compile(r"[0-9A-Za-z_-]{1,64}")


def check_group(name: str) -> str:
    """`name` when it is a group name (1-64 of A-Z a-z 0-9 . _ -, not starting with one of
    the last three); else ProtocolError naming the rule."""
    if not isinstance(name, str) or GROUP_PATTERN.fullmatch(name) is None:
        raise ProtocolError(
            f"group {name!r:.80}: 1 to 64 letters, digits, '.', '_' or '-', starting with a "
            "letter or digit"
        )
    return name


def key_token(key: str) -> str:
    """The token a message's own key ends with (its last segment)."""
    return key.rsplit("/", 1)[-1]


def ack_prefix(message_id: MessageId, token: str) -> str:
    """Where the confirmations of one message live (ends with `/`)."""
    return f"{ACKS_PREFIX}{message_id}.{token}/"


def ack_key(message_id: MessageId, token: str, group: str) -> str:
    """The key of `group`'s confirmation of the message."""
    return ack_prefix(message_id, token) + check_group(group)


@dataclass(frozen=True, slots=True)
class AckKey:
    """A parsed confirmation key."""

    message_id: MessageId
    token: str
    group: str

    @property
    def prefix(self) -> str:
        return ack_prefix(self.message_id, self.token)


def parse_ack_key(key: str) -> AckKey | None:
    """The confirmation `key` names; None for any other key."""
    if not key.startswith(ACKS_PREFIX):
        return None
    folder, _, group = key[len(ACKS_PREFIX) :].partition("/")
    raw_id, _, token = folder.rpartition(".")
    if GROUP_PATTERN.fullmatch(group) is None or _TOKEN.fullmatch(token) is None:
        return None
    try:
        message_id = MessageId.parse(raw_id)
    except ProtocolError:
        return None
    return AckKey(message_id, token, group)


def pending_prefix(group: str, batch: str) -> str:
    """Where the verified lists of one micro-batch live (ends with `/`)."""
    return f"{PENDING_PREFIX}{check_group(group)}/{batch}/"


def pending_key(group: str, batch: str, task: int, at_ms: int) -> str:
    """One task's list of the messages it verified, written at `at_ms`."""
    return f"{pending_prefix(group, batch)}{task:05d}.{at_ms}.json"


def pending_at(key: str) -> int | None:
    """When a verified list was written (ms); None for any other key."""
    if not key.startswith(PENDING_PREFIX) or not key.endswith(".json"):
        return None
    stamp = key[: -len(".json")].rpartition(".")[2]
    return int(stamp) if stamp.isascii() and stamp.isdigit() else None
