"""mosquitto's password file, read the way mosquitto 2 reads it. Pure: text in, values out.

Each line is ``user:$7$<iterations>$<salt b64>$<hash b64>`` (``sha512-pbkdf2``, the default of
``mosquitto_passwd``) or ``user:$6$<salt b64>$<hash b64>`` (``sha512``, one salted round, the
format of mosquitto 1.6 and earlier). The salt is 12 bytes, the hash 64.

A ``$7$`` hash is PBKDF2-HMAC-SHA512(password, salt, iterations): exactly SCRAM-SHA-512's
SaltedPassword (RFC 5802), so the file already holds everything a SCRAM-SHA-512 server needs
(StoredKey, ServerKey) and the gateway never sees a password. Two kinds of entries cannot do
SCRAM: ``$6$`` ones (no PBKDF2 at all) and ``$7$`` ones under 4096 iterations, the minimum of
RFC 7677 that SCRAM clients (scramp, hence hop-client) enforce. ``mosquitto_passwd`` writes 101
iterations unless told ``-I 4096``. SCRAM-SHA-256 is impossible with any of these files: its
SaltedPassword uses HMAC-SHA-256 as PRF, which a SHA-512 hash cannot be turned into.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import re
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

SCRAM_MIN_ITERATIONS = 4096
SALT_BYTES = 12
HASH_BYTES = 64
UPGRADE_HINT = "recreate it with `mosquitto_passwd -I 4096 <file> <user>` (4096 or more iterations)"

Scheme = Literal["sha512-pbkdf2", "sha512"]

_ATOI = re.compile(r"[ \t\n\v\f\r]*([+-]?[0-9]+)")


@dataclass(frozen=True, slots=True)
class ScramKeys:
    """What a SCRAM server stores for one user (RFC 5802 section 3)."""

    salt: bytes = field(repr=False)
    iterations: int
    stored_key: bytes = field(repr=False)
    server_key: bytes = field(repr=False)


@dataclass(frozen=True, slots=True)
class PasswordEntry:
    """One user's hashed password. The hash never shows in a repr."""

    user: str
    scheme: Scheme
    salt: bytes = field(repr=False)
    digest: bytes = field(repr=False)
    iterations: int = 1

    def __post_init__(self) -> None:
        if not self.user:
            raise ValueError("empty user name")
        if len(self.salt) != SALT_BYTES or len(self.digest) != HASH_BYTES:
            raise ValueError(f"salt must be {SALT_BYTES} bytes and hash {HASH_BYTES}")
        if self.iterations < 1 or (self.scheme == "sha512" and self.iterations != 1):
            raise ValueError(f"bad iteration count {self.iterations} for {self.scheme}")

    @property
    def scram_capable(self) -> bool:
        """Whether SCRAM-SHA-512 can authenticate this user (PBKDF2, >= 4096 iterations)."""
        return self.scheme == "sha512-pbkdf2" and self.iterations >= SCRAM_MIN_ITERATIONS

    def verify(self, password: str) -> bool:
        """Check a clear-text password (HTTP Basic) the way mosquitto checks CONNECT's.

        Args:
            password: the password as sent; its UTF-8 bytes are hashed, as mosquitto does.
        """
        raw = password.encode("utf-8")
        if self.scheme == "sha512-pbkdf2":
            computed = hashlib.pbkdf2_hmac("sha512", raw, self.salt, self.iterations)
        else:
            computed = hashlib.sha512(raw + self.salt).digest()
        return hmac.compare_digest(computed, self.digest)

    def scram_keys(self) -> ScramKeys | None:
        """StoredKey and ServerKey for SCRAM-SHA-512, or None when the entry cannot do SCRAM."""
        if not self.scram_capable:
            return None
        client_key = hmac.digest(self.digest, b"Client Key", "sha512")
        return ScramKeys(
            salt=self.salt,
            iterations=self.iterations,
            stored_key=hashlib.sha512(client_key).digest(),
            server_key=hmac.digest(self.digest, b"Server Key", "sha512"),
        )


@dataclass(frozen=True, slots=True)
class PasswordFile:
    """The usable entries of a password file and what was wrong with the others."""

    entries: Mapping[str, PasswordEntry]
    problems: tuple[str, ...] = ()

    def get(self, user: str) -> PasswordEntry | None:
        return self.entries.get(user)

    @property
    def typical_iterations(self) -> int:
        """The commonest iteration count of the SCRAM-capable entries (4096 if none)."""
        counts = Counter(e.iterations for e in self.entries.values() if e.scram_capable)
        return counts.most_common(1)[0][0] if counts else SCRAM_MIN_ITERATIONS

    @property
    def weak_users(self) -> tuple[str, ...]:
        """Users whose entry cannot do SCRAM-SHA-512, sorted."""
        return tuple(sorted(u for u, e in self.entries.items() if not e.scram_capable))


def _b64(token: str) -> bytes | None:
    try:
        return base64.b64decode(token, validate=True)
    except (binascii.Error, ValueError):
        return None


def parse_hash(user: str, hashed: str) -> PasswordEntry | str:
    """Decode one ``$6$...`` / ``$7$...`` field; a problem description when it is unusable.

    Args:
        user: the user name, for the entry and the problem text.
        hashed: the part of the line after the first ``:``, blanks trimmed.
    """
    # mosquitto splits with strtok, which skips empty fields: do the same.
    tokens = [t for t in hashed.split("$") if t]
    if not tokens or tokens[0] not in ("6", "7"):
        return f"invalid password hash type for user {user!r}, entry ignored"
    scheme: Scheme = "sha512" if tokens[0] == "6" else "sha512-pbkdf2"
    rest = tokens[1:]
    iterations = 1
    if scheme == "sha512-pbkdf2":
        # atoi(): leading digits count, anything else is 0.
        match = _ATOI.match(rest[0]) if rest else None
        iterations = int(match.group(1)) if match else 0
        if iterations < 1:
            return f"invalid hash iterations for user {user!r}, entry ignored"
        rest = rest[1:]
    if len(rest) < 2:
        return f"invalid password hash for user {user!r}, entry ignored"
    salt, digest = _b64(rest[0]), _b64(rest[1])
    if salt is None or len(salt) != SALT_BYTES:
        return f"unable to decode password salt for user {user!r}, entry ignored"
    if digest is None or len(digest) != HASH_BYTES:
        return f"unable to decode password for user {user!r}, entry ignored"
    return PasswordEntry(user, scheme, salt, digest, iterations)


def parse_password_file(text: str) -> PasswordFile:
    """Parse the text of a mosquitto password file as mosquitto 2 does.

    Lines starting with ``#`` and lines without ``:`` are skipped; a bad entry is dropped
    with a problem noted and the others still work (mosquitto does the same). A user listed
    twice keeps the later entry.

    Args:
        text: the whole file.
    """
    entries: dict[str, PasswordEntry] = {}
    problems: list[str] = []
    for number, line in enumerate(text.split("\n"), start=1):
        if line.startswith("#") or ":" not in line:
            continue
        fields = [f for f in line.split(":") if f]
        if not fields:
            continue
        user = fields[0].strip()
        if len(fields) < 2 or not user:
            problems.append(f"line {number}: invalid line, ignored")
            continue
        parsed = parse_hash(user, fields[1].strip())
        if isinstance(parsed, str):
            problems.append(f"line {number}: {parsed}")
            continue
        if user in entries:
            problems.append(f"line {number}: user {user!r} listed again, the later entry wins")
        entries[user] = parsed
    return PasswordFile(entries, tuple(problems))
