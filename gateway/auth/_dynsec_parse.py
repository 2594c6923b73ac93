"""The dynamic security plugin's JSON file, read the way mosquitto 2.0's plugin loads it. Pure.

The shape (what ``mosquitto_ctrl dynsec`` makes the plugin write)::

    {"defaultACLAccess": {"publishClientSend": false, "publishClientReceive": true,
                          "subscribe": false, "unsubscribe": true},
     "clients": [{"username": "u", "clientid": "c", "password": "<b64 64 bytes>",
                  "salt": "<b64 12 bytes>", "iterations": 101, "disabled": true,
                  "roles": [{"rolename": "r", "priority": 1}]}],
     "groups": [{"groupname": "g", "roles": [{"rolename": "r", "priority": 1}],
                 "clients": [{"username": "u", "priority": 1}]}],
     "roles": [{"rolename": "r", "acls": [{"acltype": "publishClientSend",
                "topic": "t/#", "priority": 0, "allow": true}]}],
     "anonymousGroup": "g"}

Read as the plugin reads it (``clients.c``, ``groups.c``, ``roles.c``, cJSON): keys match
without regard to case and the first of a repeated key counts; an entry that lacks what it
needs (a client without a user name, a role without a name, an ACL without a topic) is
skipped and noted in ``problems``; a reference to an unknown role or client is dropped;
a missing priority is -1 (roles, groups) or 0 (ACLs); ``allow`` is false unless it is a true
boolean; a missing ``defaultACLAccess`` denies everything by default. A later client, group or
role of the same name replaces an earlier one.

Stricter than the plugin, on purpose: a file that is empty, not JSON, not an object, or
whose ``clients``/``groups``/``roles`` is not a list is refused whole (the plugin would
refuse the last three at start-up, and an empty file is a truncated write here). The
watcher then keeps the last good version.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
from collections.abc import Mapping
from typing import Any

from ._dynsec import KINDS, NO_DEFAULTS, DynamicSecurity, DynClient, Event, Group, Role, RoleAcl
from ._passwd import HASH_BYTES, SALT_BYTES, PasswordEntry, PasswordFile

#: Beyond this a Basic login would cost a hashing thread seconds (scramp's bound too).
MAX_ITERATIONS = 10_000_000
_INT_MIN, _INT_MAX = -(2**31), 2**31 - 1


def _first_wins(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        out.setdefault(key, value)
    return out


def _get(obj: Any, key: str) -> Any:
    """cJSON_GetObjectItem: the first member whose name equals ``key`` without case."""
    if not isinstance(obj, dict):
        return None
    wanted = key.lower()
    for name, value in obj.items():
        if name.lower() == wanted:
            return value
    return None


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _priority(obj: Any, default: int) -> int:
    """json_get_int: a number's int value (saturated as cJSON's valueint), else the default."""
    value = _get(obj, "priority")
    if not _number(value):
        return default
    if value != value:  # NaN
        return 0
    return int(max(_INT_MIN, min(_INT_MAX, value)))


def _list(tree: Mapping[str, Any], key: str) -> list[Any]:
    value = _get(tree, key)
    if value is None:
        return []
    if not isinstance(value, list):
        raise ValueError(f"{key!r} is not a list (mosquitto refuses such a file too)")
    return value


def _b64(text: Any, size: int) -> bytes | None:
    if not isinstance(text, str):
        return None
    try:
        raw = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        return None
    return raw if len(raw) == size else None


def _password(user: str, entry: Mapping[str, Any], problems: list[str]) -> PasswordEntry | None:
    salt, digest = _get(entry, "salt"), _get(entry, "password")
    iterations = _get(entry, "iterations")
    if not (isinstance(salt, str) and isinstance(digest, str) and _number(iterations)):
        return None  # a client without a password: only other plugins could log it in
    count = int(iterations) if math.isfinite(iterations) else 0
    if count < 1 or count > MAX_ITERATIONS:
        problems.append(f"client {user!r}: iterations {iterations!r} out of range, skipped")
        raise _Skip
    salt_bytes, hash_bytes = _b64(salt, SALT_BYTES), _b64(digest, HASH_BYTES)
    if salt_bytes is None or hash_bytes is None:
        problems.append(f"client {user!r}: salt or password hash is not valid base64, skipped")
        raise _Skip
    return PasswordEntry(user, "sha512-pbkdf2", salt_bytes, hash_bytes, count)


class _Skip(Exception):
    """An entry the plugin skips as a whole."""


def _role_refs(entry: Any, roles: Mapping[str, Role]) -> tuple[Role, ...]:
    """A client's or group's roles in check order: priority high to low, then by name."""
    seen: dict[str, tuple[int, Role]] = {}
    refs = _get(entry, "roles")
    for ref in refs if isinstance(refs, list) else ():
        name = _get(ref, "rolename")
        if not isinstance(name, str) or name in seen or name not in roles:
            continue
        seen[name] = (_priority(ref, -1), roles[name])
    ordered = sorted(seen.items(), key=lambda item: (-item[1][0], item[0]))
    return tuple(role for _, (_, role) in ordered)


def _parse_role(entry: Any, problems: list[str]) -> Role | None:
    name = _get(entry, "rolename")
    if not isinstance(name, str):
        problems.append("a role without a rolename, skipped")
        return None
    per_event: dict[Event, list[RoleAcl]] = {event: [] for event in Event}
    acls = _get(entry, "acls")
    for acl in acls if isinstance(acls, list) else ():
        kind, topic = _get(acl, "acltype"), _get(acl, "topic")
        if not isinstance(kind, str) or kind.lower() not in KINDS or not isinstance(topic, str):
            continue
        event, literal = KINDS[kind.lower()]
        allow = _get(acl, "allow") is True
        per_event[event].append(RoleAcl(topic, allow, _priority(acl, 0), literal))
    # Priority high to low, file order among equals (uthash's in-order insert); a role's
    # literal (un)subscribe ACLs before its patterns, as the plugin looks them up first.
    ordered = {
        event: tuple(sorted(items, key=lambda a: (not a.literal, -a.priority)))
        for event, items in per_event.items()
        if items
    }
    return Role(name, ordered)


def _parse_client(entry: Any, roles: Mapping[str, Role], problems: list[str]) -> DynClient | None:
    user = _get(entry, "username")
    if not isinstance(user, str) or not user:
        problems.append("a client without a username, skipped")
        return None
    try:
        password = _password(user, entry, problems)
    except _Skip:
        return None
    clientid = _get(entry, "clientid")
    return DynClient(
        username=user,
        password=password,
        clientid=clientid if isinstance(clientid, str) else None,
        disabled=_get(entry, "disabled") is True,
        roles=_role_refs(entry, roles),
    )


def parse_dynsec(text: str) -> DynamicSecurity:
    """Parse the text of a dynamic security file (see the module docstring).

    Args:
        text: the whole file.

    Raises:
        ValueError: empty, not JSON, not an object, or a top-level list that is not one.
    """
    if not text.strip():
        raise ValueError("the file is empty")
    try:
        tree = json.loads(text, object_pairs_hook=_first_wins)
    except ValueError as exc:  # json.JSONDecodeError, RecursionError's cousin for depth
        raise ValueError(f"not valid JSON ({exc})") from exc
    except RecursionError as exc:
        raise ValueError("not valid JSON (nested too deeply)") from exc
    if not isinstance(tree, dict):
        raise ValueError("not a JSON object")
    problems: list[str] = []
    roles: dict[str, Role] = {}
    for entry in _list(tree, "roles"):
        role = _parse_role(entry, problems) if isinstance(entry, dict) else None
        if role is not None:
            roles[role.name] = role
    clients: dict[str, DynClient] = {}
    listed = _list(tree, "clients")
    for index, entry in enumerate(listed):
        # Each client's JSON freed as it is read: the whole tree freed at once (millions of
        # objects in a file of 100,000 clients) would hold the GIL for a tenth of a second.
        listed[index] = None
        client = _parse_client(entry, roles, problems) if isinstance(entry, dict) else None
        if client is not None:
            clients[client.username] = client
    groups: dict[str, Group] = {}
    members: dict[str, dict[str, tuple[int, str]]] = {}  # user -> group name -> priority
    for entry in _list(tree, "groups"):
        name = _get(entry, "groupname")
        if not isinstance(name, str):
            problems.append("a group without a groupname, skipped")
            continue
        groups[name] = Group(name, _role_refs(entry, roles))
        listed = _get(entry, "clients")
        for member in listed if isinstance(listed, list) else ():
            user = _get(member, "username")
            if isinstance(user, str) and user in clients:
                members.setdefault(user, {}).setdefault(name, (_priority(member, -1), name))
    for user, memberships in members.items():
        ordered = sorted(memberships.values(), key=lambda item: (-item[0], item[1]))
        client = clients[user]
        clients[user] = DynClient(
            username=client.username,
            password=client.password,
            clientid=client.clientid,
            disabled=client.disabled,
            roles=client.roles,
            groups=tuple(groups[name] for _, name in ordered),
        )
    anonymous = _get(tree, "anonymousGroup")
    entries = {c.username: c.password for c in clients.values() if c.password is not None}
    return DynamicSecurity(
        clients=clients,
        anonymous=groups.get(anonymous) if isinstance(anonymous, str) else None,
        defaults=_defaults(_get(tree, "defaultACLAccess")),
        problems=tuple(problems),
        typical_iterations=PasswordFile(entries).typical_iterations,
    )


def _defaults(value: Any) -> Mapping[Event, bool]:
    """``defaultACLAccess``: each event's flag when it is a true boolean; absent: all deny."""
    if not isinstance(value, dict):
        return NO_DEFAULTS
    return {event: _get(value, event.value) is True for event in Event}
