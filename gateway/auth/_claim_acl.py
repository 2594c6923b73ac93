"""Topic permissions carried in a JWT, in EMQX's forms. Pure.

EMQX reads an ``acl`` claim in two shapes, both accepted here:

* ``{"pub": [...], "sub": [...], "all": [...]}``: topic filters allowed for publishing,
  subscribing, or both; nothing else is allowed.
* ``[{"permission": "allow"|"deny", "action": "publish"|"subscribe"|"all",
  "topic": "t/#"}, ...]`` (``topics`` may list several): the first rule that matches decides;
  none: denied.

In filters ``${username}`` stands for the token's user and ``${clientid}`` for its
``clientid`` claim; a filter that names a value the token lacks never grants (and a denying
rule with it denies whatever the value). A value holding ``/``, ``+`` or ``#`` is not
substituted either, as mosquitto refuses ``%u`` for such names: ``sub`` "alice/x" would
otherwise turn ``up/${username}/#`` into a part of alice's own ``up/alice/#``. A filter
written ``eq <filter>`` is compared as text, wildcards and all, as EMQX does. The gateway
maps an upload to *publish* and a fetch to *subscribe*.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ._acl import filter_matches, valid_filter

_PLACEHOLDER = re.compile(r"\$\{(username|clientid)\}")

#: Most rules one claim may carry (a token is bounded anyway; this bounds the work per check).
MAX_RULES = 256
_ACTIONS = {"publish": (True, False), "subscribe": (False, True), "all": (True, True)}


@dataclass(frozen=True, slots=True)
class ClaimRule:
    """One rule: ``allow`` or deny ``topic`` for publishing and/or subscribing."""

    allow: bool
    publish: bool
    subscribe: bool
    topic: str


def _unusable(value: str | None) -> bool:
    """Whether a name cannot stand for a topic level: missing, or one that would reach
    another's topics (``/`` adds levels, ``+`` and ``#`` are wildcards)."""
    return value is None or any(ch in value for ch in "/+#")


def _expand(topic: str, user: str, client_id: str | None, allow: bool) -> str | None:
    """The filter with ``${username}`` / ``${clientid}`` filled in (both at once, so a value
    is never read for placeholders); None when a granting rule cannot apply.

    A denying rule whose value is missing or unusable still denies: a level that is exactly
    a missing ``${clientid}`` becomes ``+`` (any id), anything else ``#`` (all it covers).
    """
    if "${" not in topic:
        return topic
    values = {"username": user, "clientid": client_id}
    levels: list[str] = []
    for level in topic.split("/"):
        names = _PLACEHOLDER.findall(level)
        if not any(_unusable(values[name]) for name in names):
            levels.append(_PLACEHOLDER.sub(lambda m: values[m.group(1)] or "", level))
        elif allow:
            return None
        elif level == "${clientid}" and client_id is None:
            levels.append("+")
        else:
            return "#"
    return "/".join(levels)


@dataclass(frozen=True, slots=True)
class ClaimAcl:
    """A parsed ``acl`` claim."""

    rules: tuple[ClaimRule, ...]

    def allows(self, user: str, topic: str, *, write: bool, client_id: str | None) -> bool:
        """Whether this claim lets ``user`` publish (``write``) or subscribe to ``topic``.

        Args:
            user: the token's user name.
            topic: the concrete topic.
            write: publish (upload) rather than subscribe (fetch).
            client_id: the token's ``clientid`` claim, if any.
        """
        for rule in self.rules:
            if not (rule.publish if write else rule.subscribe):
                continue
            text = rule.topic
            if text.startswith("eq "):
                if text[3:] == topic:
                    return rule.allow
                continue
            expanded = _expand(text, user, client_id, rule.allow)
            if expanded is None or not valid_filter(expanded):
                continue
            if filter_matches(expanded, topic):
                return rule.allow
        return False


def _topics(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and all(isinstance(t, str) for t in value):
        return list(value)
    raise ValueError("topics must be strings")


def parse_claim_acl(value: Any) -> ClaimAcl:
    """The ``acl`` claim's rules.

    Args:
        value: the claim as decoded from the token.

    Raises:
        ValueError: neither of EMQX's shapes, or more than ``MAX_RULES`` rules.
    """
    rules: list[ClaimRule] = []
    if isinstance(value, Mapping):
        unknown = set(value) - {"pub", "sub", "all"}
        if unknown:
            raise ValueError(f"unknown keys {sorted(unknown)!r} (pub, sub, all)")
        for key, (publish, subscribe) in (("pub", (True, False)), ("sub", (False, True))):
            rules += [ClaimRule(True, publish, subscribe, t) for t in _topics(value.get(key, []))]
        rules += [ClaimRule(True, True, True, t) for t in _topics(value.get("all", []))]
    elif isinstance(value, list):
        for entry in value:
            if not isinstance(entry, Mapping):
                raise ValueError("each rule must be an object")
            permission, action = entry.get("permission"), entry.get("action", "all")
            if permission not in ("allow", "deny") or not isinstance(action, str):
                raise ValueError("a rule needs permission allow|deny and an action")
            if action not in _ACTIONS:
                raise ValueError(
                    "a rule needs permission allow|deny and action publish|subscribe|all"
                )
            publish, subscribe = _ACTIONS[action]
            topics = _topics(entry["topics"] if "topics" in entry else entry.get("topic"))
            rules += [ClaimRule(permission == "allow", publish, subscribe, t) for t in topics]
    else:
        raise ValueError("the acl claim must be an object or a list")
    if len(rules) > MAX_RULES:
        raise ValueError(f"more than {MAX_RULES} rules")
    return ClaimAcl(tuple(rules))
