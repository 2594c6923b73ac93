"""Which consumer groups must receive which topics' payloads: the operator's groups file.

`OFFLOAD_RETENTION_GROUPS_FILE`, TOML, re-read when it changes (as the ACL file is)::

    # A payload on a matching topic is kept until every group named confirmed it (or it
    # expires). Several matching filters: every group of each.
    [topics]
    "cameras/#" = ["archive", "analytics"]
    "sensors/+/image" = ["archive"]

    # Optional: who may confirm for a group (user names as the gateway authenticates them).
    # A group not listed here: anyone who may read the message's topic.
    [members]
    archive = ["archiver-1", "archiver-2"]

A message's groups are fixed in its manifest when it is committed: a change to the file
applies to messages committed afterwards. A file that turns invalid keeps the last valid
version in force (logged, and on /healthz is not affected): refusing every commit over a
typo would stop every upload.
"""

from __future__ import annotations

import logging
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from client.protocol import ProtocolError, Topic, TopicFilter, check_group

from ..auth import WatchedFile

log = logging.getLogger("gateway.retention")

#: Distinct group names a file may declare: every manifest carries its groups.
MAX_GROUPS = 64
#: Topic filters a file may list (each commit matches its topic against all of them).
MAX_FILTERS = 10_000


@dataclass(frozen=True, slots=True)
class GroupRules:
    """The parsed groups file; empty: no topic has groups (today's TTL for all)."""

    topics: tuple[tuple[TopicFilter, tuple[str, ...]], ...] = ()
    members: dict[str, frozenset[str]] = field(default_factory=dict)

    def groups_for(self, topic: Topic) -> tuple[str, ...]:
        """Every group of every filter matching `topic`, sorted; () when none does."""
        found: set[str] = set()
        for topic_filter, groups in self.topics:
            if topic_filter.matches(topic):
                found.update(groups)
        return tuple(sorted(found))

    def may_confirm(self, group: str, user: str | None) -> bool:
        """Whether `user` may confirm for `group` (anyone when the group lists no members)."""
        members = self.members.get(group)
        return members is None or (user is not None and user in members)


def parse_groups(text: str) -> GroupRules:
    """The groups file's rules.

    Raises:
        ValueError: not TOML, or a filter, group or user that is not one (the reason
            names it).
    """
    doc = tomllib.loads(text)
    unknown = set(doc) - {"topics", "members"}
    if unknown:
        raise ValueError(f"unknown tables {sorted(unknown)}: only [topics] and [members]")
    topics = _table(doc, "topics")
    if len(topics) > MAX_FILTERS:
        raise ValueError(f"{len(topics)} topic filters: at most {MAX_FILTERS}")
    rules: list[tuple[TopicFilter, tuple[str, ...]]] = []
    names: set[str] = set()
    for raw_filter, groups in topics.items():
        try:
            topic_filter = TopicFilter(raw_filter)
            listed = tuple(check_group(g) for g in _names(groups, f"topics.{raw_filter!r}"))
        except ProtocolError as exc:
            raise ValueError(f"topics.{raw_filter!r}: {exc}") from exc
        names.update(listed)
        rules.append((topic_filter, listed))
    if len(names) > MAX_GROUPS:
        raise ValueError(f"{len(names)} groups: at most {MAX_GROUPS}")
    members = {
        check_group(group): frozenset(_names(users, f"members.{group}"))
        for group, users in _table(doc, "members").items()
    }
    return GroupRules(tuple(rules), members)


def _table(doc: dict[str, object], name: str) -> dict[str, object]:
    table = doc.get(name, {})
    if not isinstance(table, dict):
        raise ValueError(f"[{name}] must be a table")
    return table


def _names(value: object, where: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise ValueError(f"{where} must be a list of names")
    return value


class Groups:
    """The rules in force: the file's, re-read when it changes; none without a file.

    Args:
        path: the groups file (`OFFLOAD_RETENTION_GROUPS_FILE`); None: no groups.

    Raises:
        AuthConfigError: the file cannot be read or parsed at start (the gateway does not
            start with it, as with the ACL file).
    """

    def __init__(self, path: Path | None) -> None:
        self._file = (
            None
            if path is None
            else WatchedFile(path, parse_groups, fallback=GroupRules(), keep_last_good=True)
        )

    @property
    def rules(self) -> GroupRules:
        return GroupRules() if self._file is None else self._file.get()

    @property
    def problem(self) -> str | None:
        """Why the rules in force are not the file's (it turned invalid), else None."""
        return None if self._file is None else self._file.problem
