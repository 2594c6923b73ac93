"""mosquitto's ``acl_file``, read and applied the way mosquitto 2 does. Pure: text in, answers out.

The rules, as mosquitto 2.0 applies them (``src/security_default.c``) and as the tests check
against a running mosquitto:

* ``topic [read|write|readwrite|deny] <filter>``; without an access word the line grants
  read and write (so ``topic read`` alone is the topic ``read``, read-write: mosquitto's
  reading, kept). The filter may hold MQTT wildcards and spaces.
* ``topic`` lines before the first ``user <name>`` line are the anonymous clients' rules,
  the ones after it that user's. Two blocks for one user add up.
* ``pattern`` lines apply to every client wherever they stand, with ``%u`` replaced by the
  user name (lines with ``%u`` never apply to anonymous clients) and ``%c`` by the client id.
* A check looks at the client's own rules first: a matching ``deny`` refuses, else a matching
  grant with the wanted access allows. Only if neither, the patterns are looked at the same
  way. So a user's own grant beats a ``pattern ... deny``; within one list ``deny`` wins.
* Topics starting with ``$`` only match rules starting with ``$``.
* Once an ACL file is in use, whatever no rule grants is refused (an empty file refuses all).
* A user name or client id holding ``+`` or ``#`` is refused when patterns exist.
* Lines starting with ``#`` are comments; words are separated by spaces only; any other
  line (also one starting with a blank then ``#``) makes the whole file invalid.

The HTTP gateway has no MQTT client id. Callers pass ``client_id=None``: then a granting
pattern with ``%c`` never applies, and a denying one applies as if ``%c`` were ``+`` (any id),
so the missing id can only ever take access away.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

READ = 1
WRITE = 2
DENY = 0
OVERSIZED_SUFFIX = "+oversized"
_ACCESS = {"read": READ, "write": WRITE, "readwrite": READ | WRITE, "deny": DENY}
_MAX_TOPIC = 65535


class AclSyntaxError(ValueError):
    """A line that makes mosquitto refuse the whole file. ``.line`` is 1-based."""

    def __init__(self, message: str, line: int) -> None:
        super().__init__(f"line {line}: {message}")
        self.line = line


def valid_filter(topic_filter: str) -> bool:
    """Whether a string is a valid MQTT subscription filter (mosquitto_sub_topic_check).

    Args:
        topic_filter: the filter to check.
    """
    if not topic_filter or len(topic_filter.encode("utf-8")) > _MAX_TOPIC:
        return False
    if "\0" in topic_filter:
        return False
    levels = topic_filter.split("/")
    for index, level in enumerate(levels):
        if "+" in level and level != "+":
            return False
        if "#" in level and (level != "#" or index != len(levels) - 1):
            return False
    return True


def filter_matches(topic_filter: str, topic: str) -> bool:
    """MQTT filter matching as mosquitto_topic_matches_sub does it.

    ``a/#`` matches ``a``; ``+`` matches an empty level; a leading wildcard does not match a
    ``$`` topic; a topic holding a wildcard matches nothing.

    Args:
        topic_filter: the filter (from an ACL rule).
        topic: the concrete topic name.
    """
    if not topic_filter or not topic or "+" in topic or "#" in topic:
        return False
    if (topic_filter[0] == "$") != (topic[0] == "$"):
        return False
    wanted = topic_filter.split("/")
    levels = topic.split("/")
    for index, level in enumerate(wanted):
        if level == "#":
            return index == len(wanted) - 1
        if index >= len(levels) or (level != "+" and level != levels[index]):
            return False
    return len(wanted) == len(levels)


def base_topic(topic: str) -> str:
    """The MQTT topic an offload path stands for: ``a/b+oversized`` -> ``a/b``.

    hop-client posts to ``/topic/<topic>+oversized``; ACLs speak of the plain topic.

    Args:
        topic: the topic as it appears in the request path.
    """
    if topic.endswith(OVERSIZED_SUFFIX) and len(topic) > len(OVERSIZED_SUFFIX):
        return topic[: -len(OVERSIZED_SUFFIX)]
    return topic


@dataclass(frozen=True, slots=True)
class AclRule:
    """One ``topic`` or ``pattern`` line: ``access`` is READ, WRITE, both, or DENY (0)."""

    access: int
    topic_filter: str

    def __post_init__(self) -> None:
        if self.access not in (DENY, READ, WRITE, READ | WRITE):
            raise ValueError(f"bad access {self.access}")
        if not valid_filter(self.topic_filter):
            raise ValueError(f"invalid ACL topic {self.topic_filter!r}")


def _ordered(rules: list[AclRule]) -> tuple[AclRule, ...]:
    # mosquitto puts deny rules in front of the list, so any matching deny is seen first.
    return tuple([r for r in rules if r.access == DENY] + [r for r in rules if r.access])


def _substitute(rule: AclRule, user: str | None, client_id: str | None) -> str | None:
    """The filter of a pattern for one client, or None when the pattern does not apply."""
    text = rule.topic_filter
    if "%u" in text and user is None:
        return None
    if "%c" in text and client_id is None:
        if rule.access != DENY:
            return None
        # No client id over HTTP: a denying level with %c denies for any id.
        text = "/".join("+" if "%c" in level else level for level in text.split("/"))
    out: list[str] = []
    index = 0
    # Left to right, two characters at a time, exactly as mosquitto expands them.
    while index < len(text):
        pair = text[index : index + 2]
        if pair == "%c" and client_id is not None:
            out.append(client_id)
            index += 2
        elif pair == "%u" and user is not None:
            out.append(user)
            index += 2
        else:
            out.append(text[index])
            index += 1
    return "".join(out)


@dataclass(frozen=True, slots=True)
class Acl:
    """A parsed ACL file. ``anonymous`` is None when no rule precedes the first user line."""

    anonymous: tuple[AclRule, ...] | None = None
    users: Mapping[str, tuple[AclRule, ...]] = field(default_factory=dict)
    patterns: tuple[AclRule, ...] = ()

    def allows(
        self, user: str | None, topic: str, access: int, *, client_id: str | None = None
    ) -> bool:
        """Whether mosquitto would let this client read or write this topic.

        Args:
            user: the authenticated user name, None for an anonymous client.
            topic: the concrete topic (no wildcards).
            access: READ or WRITE.
            client_id: the MQTT client id; None over HTTP (see the module docstring).
        """
        if access not in (READ, WRITE):
            raise ValueError("access must be READ or WRITE")
        own = self.anonymous if user is None else self.users.get(user)
        if own is None and not self.patterns:
            return False
        for rule in own or ():
            if topic.startswith("$") and not rule.topic_filter.startswith("$"):
                continue
            if filter_matches(rule.topic_filter, topic):
                if rule.access == DENY:
                    return False
                if access & rule.access:
                    return True
        if not self.patterns:
            return False
        if user is not None and ("+" in user or "#" in user):
            return False
        if client_id is not None and ("+" in client_id or "#" in client_id):
            return False
        for rule in self.patterns:
            expanded = _substitute(rule, user, client_id)
            if expanded is None or not filter_matches(expanded, topic):
                continue
            if rule.access == DENY:
                return False
            if access & rule.access:
                return True
        return False


def parse_acl(text: str) -> Acl:
    """Parse the text of a mosquitto ``acl_file`` (see the module docstring for the rules).

    Args:
        text: the whole file.

    Raises:
        AclSyntaxError: for any line mosquitto refuses; mosquitto then refuses the whole file.
    """
    anonymous: list[AclRule] = []
    users: dict[str, list[AclRule]] = {}
    patterns: list[AclRule] = []
    user: str | None = None
    for number, raw in enumerate(text.split("\n"), start=1):
        line = raw.rstrip(" \t\n\v\f\r")
        if line.startswith("#"):
            continue
        words = line.lstrip(" ").split(" ", 1)
        keyword = words[0]
        rest = words[1] if len(words) > 1 else ""
        if not keyword:
            continue
        if keyword in ("topic", "pattern"):
            parts = rest.lstrip(" ").split(" ", 1)
            access_word = parts[0]
            if not access_word:
                raise AclSyntaxError("empty topic", number)
            remainder = parts[1].strip(" \t") if len(parts) > 1 else ""
            if remainder:
                if access_word not in _ACCESS:
                    raise AclSyntaxError(f"invalid topic access type {access_word!r}", number)
                access, topic_filter = _ACCESS[access_word], remainder
            else:
                access, topic_filter = READ | WRITE, access_word
            if not valid_filter(topic_filter):
                raise AclSyntaxError(f"invalid ACL topic {topic_filter!r}", number)
            rule = AclRule(access, topic_filter)
            if keyword == "pattern":
                patterns.append(rule)
            elif user is None:
                anonymous.append(rule)
            else:
                users.setdefault(user, []).append(rule)
        elif keyword == "user":
            name = rest.strip(" \t")
            if not name:
                raise AclSyntaxError("missing username", number)
            user = name
        else:
            raise AclSyntaxError(f"invalid line {line!r}", number)
    return Acl(
        anonymous=_ordered(anonymous) if anonymous else None,
        users={name: _ordered(rules) for name, rules in users.items()},
        patterns=_ordered(patterns),
    )
