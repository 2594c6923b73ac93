"""The credentials files the gateway shares with mosquitto, kept current, and what they answer.

The password, ACL and tokens files are the broker's (one identity for broker and offload API),
so the gateway re-reads them whenever an administrator changes them, with no restart, on a
thread of their own (see ``_files.WatchedFile``). This module owns the watched files and every
question the schemes ask of them: a user's SCRAM keys (with stable decoys for unknown or
SCRAM-less users, so a probe cannot tell them apart), a Basic password check that costs the
same for an unknown user, a bearer token's user, and the ACL's answer for a topic. No HTTP, no
failure counting: those belong to the authenticator and its throttle.
"""

from __future__ import annotations

import functools
import hmac
import logging
from collections.abc import Mapping
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from ._acl import READ, WRITE, Acl, AclSyntaxError, base_topic, parse_acl
from ._dynsec import DynamicSecurity, Event
from ._dynsec_parse import parse_dynsec
from ._exceptions import AuthConfigError
from ._files import WatchedFile
from ._passwd import (
    SCRAM_MIN_ITERATIONS,
    UPGRADE_HINT,
    PasswordEntry,
    PasswordFile,
    ScramKeys,
    parse_password_file,
)
from ._tokens import parse_tokens_file, token_digest

log = logging.getLogger("gateway.auth")

# Hashed when a Basic user does not exist, so that the answer takes as long as for one who does.
_DUMMY = PasswordEntry("-", "sha512-pbkdf2", b"\0" * 12, b"\0" * 64, SCRAM_MIN_ITERATIONS)
# What a dynamic security client that cannot do SCRAM is told to do instead.
DYNSEC_HINT = (
    "mosquitto 2.0's mosquitto_ctrl hashes passwords with 101 iterations, too few for "
    "SCRAM-SHA-512 (clients refuse fewer than 4096): such clients log in with HTTP Basic "
    "over TLS, or a JWT"
)


def _parse_acl_file(text: str) -> Acl:
    try:
        return parse_acl(text)
    except AclSyntaxError as exc:
        raise AuthConfigError(str(exc)) from exc


class Credentials:
    """The password or dynamic security, ACL and tokens files (each optional), re-read when
    they change.

    Thread-safe: each file is a `WatchedFile`; the set of users already warned about is only
    ever added to or cleared whole.
    """

    def __init__(
        self,
        *,
        password_file: Path | None,
        acl_file: Path | None,
        tokens_file: Path | None,
        secret: bytes,
        dynsec_file: Path | None = None,
        dynsec_substitute: bool = False,
    ) -> None:
        """Load the files that are set.

        Args:
            password_file: mosquitto's ``password_file``, or None.
            acl_file: mosquitto's ``acl_file``, or None (everything allowed).
            tokens_file: bearer tokens (``user:<sha256 hex>``), or None.
            secret: seeds the decoy SCRAM keys (the authenticator's sid secret).
            dynsec_file: the dynamic security plugin's JSON file (users and rules), or None;
                not with ``password_file`` or ``acl_file``.
            dynsec_substitute: expand ``%c``/``%u`` in its ACLs, as mosquitto 2.1 does.

        Raises:
            AuthConfigError: a file is missing or invalid.
        """
        self._secret = secret
        self._warned: set[str] = set()
        self._passwords = (
            WatchedFile(
                password_file,
                parse_password_file,
                fallback=PasswordFile({}),
                on_load=self._loaded_passwords,
            )
            if password_file is not None
            else None
        )
        self._acl = (
            WatchedFile(acl_file, _parse_acl_file, fallback=Acl()) if acl_file is not None else None
        )
        self._dynsec_substitute = dynsec_substitute
        # Rewritten by the plugin at every change: a bad version is a mishap, so the last
        # good one stays in force (and /healthz says so).
        self._dynsec = (
            WatchedFile(
                dynsec_file,
                parse_dynsec,
                fallback=DynamicSecurity(),
                on_load=self._loaded_dynsec,
                keep_last_good=True,
            )
            if dynsec_file is not None
            else None
        )
        no_tokens: Mapping[str, str] = {}
        self._tokens = (
            WatchedFile(tokens_file, parse_tokens_file, fallback=no_tokens)
            if tokens_file is not None
            else None
        )

    @property
    def has_acl(self) -> bool:
        """Whether rules restrict topics (without, everyone in may do anything)."""
        return self._acl is not None or self._dynsec is not None

    @property
    def has_tokens(self) -> bool:
        return self._tokens is not None

    def disabled(self, user: str) -> bool:
        """Whether the dynamic security file holds ``user`` as a disabled client.

        Args:
            user: a user some other login (a JWT) vouches for.
        """
        if self._dynsec is None:
            return False
        client = self._dynsec.get().clients.get(user)
        return client is not None and client.disabled

    def problems(self) -> list[str]:
        """Why a file in force is not the one on disk (a dynamic security file gone bad)."""
        return [self._dynsec.problem] if self._dynsec and self._dynsec.problem else []

    def reloading(self) -> list[Future[Any]]:
        """The reloads of changed files to wait for before deciding (`WatchedFile.reloading`:
        none for a large file, which is used as it was while it is parsed)."""
        files = (self._passwords, self._acl, self._dynsec, self._tokens)
        found = (file.reloading() for file in files if file is not None)
        return [reload for reload in found if reload is not None]

    def allows(
        self, user: str | None, topic: str, access: int, *, client_id: str | None = None
    ) -> bool:
        """The rules' answer for ``user`` and ``topic`` (``+oversized`` ignored); True without.

        With dynamic security a write is a PUBLISH (``publishClientSend``), a read what a
        subscriber of exactly the topic needs: the SUBSCRIBE allowed, then
        ``publishClientReceive``.

        Args:
            user: None for anonymous.
            topic: the MQTT topic.
            access: ``_acl.READ`` or ``_acl.WRITE``.
            client_id: the client id, when the credentials name one (a JWT's claim).
        """
        topic = base_topic(topic)
        if self._dynsec is not None:
            rules = self._dynsec.get()  # one version for the whole decision
            check = functools.partial(
                rules.allows, user, topic, client_id=client_id, substitute=self._dynsec_substitute
            )
            if access == WRITE:
                return check(Event.PUBLISH_SEND)
            return access == READ and check(Event.SUBSCRIBE) and check(Event.PUBLISH_RECEIVE)
        if self._acl is None:
            return True
        return self._acl.get().allows(user, topic, access)

    def _entry(self, user: str) -> PasswordEntry | None:
        if self._dynsec is not None:
            return self._dynsec.get().password(user)
        assert self._passwords is not None  # passwords are only asked for with a source
        return self._passwords.get().get(user)

    def check_password(self, user: str, password: str) -> bool | None:
        """Whether ``password`` is ``user``'s; None for an unknown user (at the same cost).

        Args:
            user: the Basic user name.
            password: the Basic password.
        """
        entry = self._entry(user)
        if entry is None:
            _DUMMY.verify(password)
            return None
        return entry.verify(password)

    def token_user(self, token: str) -> str | None:
        """The user a bearer token belongs to, or None.

        Args:
            token: the Bearer credential as sent.
        """
        assert self._tokens is not None  # Bearer is only offered with a tokens file
        # A dict lookup by the token's SHA-256: its timing says nothing about stored tokens.
        return self._tokens.get().get(token_digest(token)) if token else None

    def scram_impossible(self, user: str) -> bool:
        """Whether ``user`` has a password entry that cannot do SCRAM-SHA-512 (fewer than
        4096 iterations, ``$6$``): known, enabled, but only HTTP Basic can check it.

        Args:
            user: from the client-first message.
        """
        entry = self._entry(user)
        return entry is not None and not entry.scram_capable

    def scram_keys(self, user: str) -> ScramKeys:
        """``user``'s SCRAM-SHA-512 keys, or decoy keys when it has none.

        Decoys are stable per user, so a probe cannot tell unknown users from known ones; a
        known user whose entry cannot do SCRAM is named in the log once per file load.

        Args:
            user: from the client-first message.
        """
        entry = self._entry(user)
        keys = entry.scram_keys() if entry is not None else None
        if keys is not None:
            return keys
        if entry is not None and user not in self._warned:
            self._warned.add(user)
            log.warning(
                "user %r tried SCRAM-SHA-512 but its password entry cannot do it "
                "(%s, %d iterations); %s",
                user,
                entry.scheme,
                entry.iterations,
                DYNSEC_HINT if self._dynsec is not None else UPGRADE_HINT,
            )
        seed = hmac.digest(self._secret, b"decoy\0" + user.encode("utf-8"), "sha512")
        return ScramKeys(seed[:12], self._typical_iterations(), seed, seed[::-1])

    def _typical_iterations(self) -> int:
        if self._dynsec is None:
            assert self._passwords is not None
            return self._passwords.get().typical_iterations
        return self._dynsec.get().typical_iterations

    def _loaded_dynsec(self, rules: DynamicSecurity) -> None:
        self._warned.clear()
        for problem in rules.problems:
            log.warning("dynamic security file: %s", problem)
        log.info(
            "dynamic security file: %d client(s), anonymous group %s",
            len(rules.clients),
            repr(rules.anonymous.name) if rules.anonymous else "none",
        )

    def _loaded_passwords(self, passwords: PasswordFile) -> None:
        # Each load says once what is wrong with it, and who cannot use SCRAM and why.
        self._warned.clear()
        for problem in passwords.problems:
            log.warning("password file: %s", problem)
        weak = passwords.weak_users
        if weak:
            log.warning(
                "password file: %d user(s) cannot use SCRAM-SHA-512 (sha512 entries or fewer "
                "than %d iterations): %s; they can only use HTTP Basic over TLS. Fix: %s",
                len(weak),
                SCRAM_MIN_ITERATIONS,
                ", ".join(weak),
                UPGRADE_HINT,
            )
