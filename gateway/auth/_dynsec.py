"""mosquitto's dynamic security plugin: its clients, groups and roles, decided as the plugin
decides. Pure: a parsed file in, answers out (`_dynsec_parse` reads the JSON).

How the plugin decides (mosquitto 2.0, ``plugins/dynamic-security/acl.c``; checked against a
running mosquitto by ``tests/test_auth_dynsec_mosquitto.py``):

* Four events, each with its own ACL kinds: a client's PUBLISH (``publishClientSend``), a
  message about to reach it (``publishClientReceive``), a SUBSCRIBE (``subscribeLiteral`` then
  ``subscribePattern``, per role) and an UNSUBSCRIBE (``unsubscribeLiteral`` /
  ``unsubscribePattern``).
* A client's own roles are looked at first, highest priority first (equal priorities by role
  name); then its groups, highest membership priority first (then by group name), each
  group's roles in the same order. Within a role the ACLs of the event's kind go highest
  priority first (file order among equals). The first ACL that matches decides: allow or deny.
* A user name the plugin does not know is refused (the plugin defers, and nothing else
  grants); an anonymous client gets the anonymous group's roles, if one is named.
* Nothing matched: ``defaultACLAccess`` for the event, never for ``$CONTROL`` topics.
* Before the plugin the broker itself refuses publishing to ``$SYS`` (but bridge state) and
  publishing or receiving ``$share`` topics.
* Publish ACLs match as MQTT filters (``+`` and ``#`` never match a leading ``$`` level);
  ``subscribePattern`` compares the ACL with the subscription (``sub_acl_check``: ``#``
  matches everything, ``$`` topics too); ``subscribeLiteral`` compares strings.
* mosquitto 2.0 reads ``%c`` and ``%u`` in ACL topics literally. mosquitto 2.1 replaces a
  level that is exactly ``%c`` / ``%u`` with the client id / user name
  (``substitute=True``). Over HTTP the gateway knows a client id only for a client the file
  binds to one (``clientid``): without one a granting ``%c`` ACL never matches and a
  denying one matches any id, so a missing id only ever takes access away.

The gateway's operations are these events: an upload for topic T is a PUBLISH on T; fetching
a message of topic T needs what a subscriber of exactly T needs to get it: SUBSCRIBE of T
allowed, and then ``publishClientReceive`` on T (the plugin's default lets every
subscriber receive, so the subscription is the gate).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import Enum

from ._acl import filter_matches, valid_filter
from ._passwd import SCRAM_MIN_ITERATIONS, PasswordEntry


class Event(Enum):
    """The plugin's ACL events, valued by their ``defaultACLAccess`` key."""

    PUBLISH_SEND = "publishClientSend"
    PUBLISH_RECEIVE = "publishClientReceive"
    SUBSCRIBE = "subscribe"
    UNSUBSCRIBE = "unsubscribe"


#: The ACL kinds of a role file entry (``acltype``, compared without case), by event.
KINDS = {
    "publishclientsend": (Event.PUBLISH_SEND, False),
    "publishclientreceive": (Event.PUBLISH_RECEIVE, False),
    "subscribeliteral": (Event.SUBSCRIBE, True),
    "subscribepattern": (Event.SUBSCRIBE, False),
    "unsubscribeliteral": (Event.UNSUBSCRIBE, True),
    "unsubscribepattern": (Event.UNSUBSCRIBE, False),
}


@dataclass(frozen=True, slots=True)
class RoleAcl:
    """One ACL of a role: ``literal`` for the ``*Literal`` kinds (exact string compare)."""

    topic: str
    allow: bool
    priority: int
    literal: bool = False


@dataclass(frozen=True, slots=True)
class Role:
    """A role: its ACLs per event, each tuple already in the plugin's check order."""

    name: str
    acls: Mapping[Event, tuple[RoleAcl, ...]] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Group:
    """A group: its roles in check order."""

    name: str
    roles: tuple[Role, ...] = ()


@dataclass(frozen=True, slots=True)
class DynClient:
    """A client of the file. The password hash never shows in a repr."""

    username: str
    password: PasswordEntry | None = field(default=None, repr=False)
    clientid: str | None = None
    disabled: bool = False
    roles: tuple[Role, ...] = ()
    groups: tuple[Group, ...] = ()  # in check order (membership priority, then name)


#: The plugin's defaults when the file names none (``default_access`` in plugin.c).
NO_DEFAULTS: Mapping[Event, bool] = dict.fromkeys(Event, False)


def _dollar_allows(topic: str, event: Event) -> bool:
    """The broker's own check before any plugin (``acl__check_dollar``)."""
    if topic.startswith("$SYS"):
        if event is Event.PUBLISH_SEND:
            return filter_matches("$SYS/broker/connection/+/state", topic)
        return True
    if topic.startswith("$share"):
        return event in (Event.SUBSCRIBE, Event.UNSUBSCRIBE)
    return True


def sub_acl_check(acl: str, sub: str) -> bool:
    """Whether a subscription falls under a ``*Pattern`` ACL, as mosquitto 2.0 decides it
    (``sub_matches_sub.c``): level by level, ``+`` any one level, a trailing ``#`` the rest,
    and no special case for ``$`` topics.

    Args:
        acl: the ACL's topic filter.
        sub: the subscription's topic filter.
    """
    if acl == "#":
        return True
    acl_hash = acl.endswith("/#")
    if acl_hash:
        acl = acl[:-2]
    sub_hash = sub == "#" or sub.endswith("/#")
    if sub_hash:
        sub = sub[:-1] if sub == "#" else sub[:-2]
    if sub_hash and not acl_hash:
        return False
    acl_levels, sub_levels = acl.split("/"), sub.split("/")
    if len(acl_levels) > len(sub_levels):
        return False
    if len(sub_levels) > len(acl_levels) and not acl_hash:
        return False
    for index, level in enumerate(sub_levels):
        if index < len(acl_levels):
            if acl_levels[index] not in ("+", level):
                return False
        elif not acl_hash:  # pragma: no cover - ruled out by the level counts above
            return False
    return True


def _substitute(topic: str, *, user: str | None, client_id: str | None, allow: bool) -> str | None:
    """mosquitto 2.1's ``%c``/``%u`` levels filled in; None when the ACL cannot match.

    A value the gateway does not know (no client id over HTTP) leaves a granting ACL without
    a match and turns a denying one's level into ``+``: missing knowledge never grants.
    """
    levels = topic.split("/")
    for index, level in enumerate(levels):
        if level not in ("%c", "%u"):
            continue
        value = client_id if level == "%c" else user
        if not value or value in ("+", "#") or "/" in value:
            if value is None and not allow:
                levels[index] = "+"
                continue
            return None
        levels[index] = value
    return "/".join(levels)


def _matches(acl: RoleAcl, event: Event, topic: str) -> bool:
    if acl.literal:
        return acl.topic == topic
    if event in (Event.SUBSCRIBE, Event.UNSUBSCRIBE):
        return sub_acl_check(acl.topic, topic)
    return valid_filter(acl.topic) and filter_matches(acl.topic, topic)


@dataclass(frozen=True, slots=True)
class DynamicSecurity:
    """A parsed dynamic security file. ``problems`` lists what its parser skipped."""

    clients: Mapping[str, DynClient] = field(default_factory=dict)
    anonymous: Group | None = None
    defaults: Mapping[Event, bool] = field(default_factory=lambda: NO_DEFAULTS)
    problems: tuple[str, ...] = ()
    typical_iterations: int = SCRAM_MIN_ITERATIONS  # of the decoys for unknown users

    def password(self, user: str) -> PasswordEntry | None:
        """``user``'s password hash, None for an unknown or disabled client or one without.

        Args:
            user: the login's user name.
        """
        client = self.clients.get(user)
        if client is None or client.disabled:
            return None
        return client.password

    def allows(
        self,
        user: str | None,
        topic: str,
        event: Event,
        *,
        client_id: str | None = None,
        substitute: bool = False,
    ) -> bool:
        """Whether the plugin lets this client through for this event on this topic.

        A disabled client is refused everything here too (the plugin only refuses its
        login; the gateway may meet it under another login, a JWT).

        Args:
            user: the user name; None for an anonymous client.
            topic: the topic (PUBLISH events) or subscription filter.
            event: which check.
            client_id: the MQTT client id; None over HTTP, where a client the file binds to
                an id gets that one.
            substitute: expand ``%c``/``%u`` levels as mosquitto 2.1 does.
        """
        if not topic or not _dollar_allows(topic, event):
            return False
        rolelists: Iterable[tuple[Role, ...]]
        if user is not None:
            client = self.clients.get(user)
            if client is None or client.disabled:
                return False
            client_id = client_id if client_id is not None else client.clientid
            rolelists = (client.roles, *(group.roles for group in client.groups))
        elif self.anonymous is not None:
            rolelists = (self.anonymous.roles,)
        else:
            rolelists = ()
        for roles in rolelists:
            for role in roles:
                decision = _role_decides(
                    role, event, topic, user=user, client_id=client_id, substitute=substitute
                )
                if decision is not None:
                    return decision
        return self.defaults[event] and not topic.startswith("$CONTROL")


def _role_decides(
    role: Role,
    event: Event,
    topic: str,
    *,
    user: str | None,
    client_id: str | None,
    substitute: bool,
) -> bool | None:
    """The first matching ACL's verdict in one role, None when none matches."""
    # For (un)subscriptions the parser put a role's literal ACLs before its patterns: the
    # plugin looks the literal one up first.
    for acl in role.acls.get(event, ()):
        if substitute and not acl.literal and "%" in acl.topic:
            expanded = _substitute(acl.topic, user=user, client_id=client_id, allow=acl.allow)
            if expanded is None:
                continue
            acl = RoleAcl(expanded, acl.allow, acl.priority)
        if _matches(acl, event, topic):
            return acl.allow
    return None
