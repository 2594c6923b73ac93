"""The age v1 header (age-encryption.org/v1): parsed, opened with an identity, written.

The header wraps a message's file key for each recipient and ends with a MAC under that file
key; :mod:`client.protocol._age` encrypts and decrypts the payload that follows it. Pure.

Everything read is hostile: the header is bounded (:data:`MAX_HEADER`, :data:`MAX_STANZAS`)
before it is parsed, and every failure is a :class:`DecryptionFailed` or
:class:`NoMatchingIdentity`, never another exception. Stanzas of other types (scrypt, ssh,
grease) are parsed and skipped, as age does.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from ._age_keys import Identity, Recipient, Stanza, b64, hkdf, unb64, wrap
from ._errors import DecryptionFailed, NoMatchingIdentity

VERSION_LINE = b"age-encryption.org/v1"
MAGIC = VERSION_LINE + b"\n"
MAX_HEADER = 64 * 1024  # ~600 X25519 recipients
MAX_STANZAS = 256
_COLUMNS = 64


def _stanza_bytes(stanza: Stanza) -> bytes:
    line = b" ".join([b"->", stanza.type.encode(), *(a.encode() for a in stanza.args)])
    body = b64(stanza.body)
    lines = [body[i : i + _COLUMNS] for i in range(0, len(body), _COLUMNS)]
    if not lines or len(lines[-1]) == _COLUMNS:
        lines.append(b"")  # the body ends with a line shorter than 64 columns
    return line + b"\n" + b"\n".join(lines) + b"\n"


def _mac(file_key: bytes, header_to_dashes: bytes) -> bytes:
    key = hkdf(file_key, b"", b"header")
    return hmac.new(key, header_to_dashes, hashlib.sha256).digest()


def _arg_ok(arg: bytes) -> bool:
    return bool(arg) and all(33 <= b <= 126 for b in arg)


@dataclass(frozen=True, slots=True)
class Header:
    """A parsed age header: its stanzas, its MAC, and where the payload starts."""

    stanzas: tuple[Stanza, ...]
    mac: bytes
    signed: bytes  # the header up to and including `---`, which the MAC covers
    length: int  # bytes up to and including the MAC line's newline

    @classmethod
    def parse(cls, data: bytes | bytearray) -> Header | None:
        """The header at the start of `data`; None while more bytes are needed.

        Raises:
            DecryptionFailed: not an age v1 header, or one over the bounds.
        """
        head = bytes(data[: MAX_HEADER + 1])
        if not head.startswith(MAGIC[: len(head)]):
            raise DecryptionFailed("not an age v1 file (age-encryption.org/v1)")
        end = head.find(b"\n--- ")
        end_line = -1 if end < 0 else head.find(b"\n", end + 5)
        if end_line < 0:
            if len(head) > MAX_HEADER:
                raise DecryptionFailed(f"age header longer than {MAX_HEADER} bytes")
            return None
        lines = head[: end + 1].split(b"\n")[:-1]
        if lines[0] != VERSION_LINE:
            raise DecryptionFailed("not an age v1 file (age-encryption.org/v1)")
        stanzas: list[Stanza] = []
        i = 1
        while i < len(lines):
            parts = lines[i].split(b" ")
            if parts[0] != b"->" or len(parts) < 2 or not all(_arg_ok(p) for p in parts[1:]):
                raise DecryptionFailed("age header: malformed stanza line")
            if len(stanzas) >= MAX_STANZAS:
                raise DecryptionFailed(f"age header: more than {MAX_STANZAS} stanzas")
            body_lines: list[bytes] = []
            i += 1
            while True:
                if i >= len(lines):
                    raise DecryptionFailed("age header: stanza body not terminated")
                line = lines[i]
                i += 1
                if len(line) > _COLUMNS:
                    raise DecryptionFailed("age header: stanza body line too long")
                body_lines.append(line)
                if len(line) < _COLUMNS:
                    break
            args = tuple(p.decode("ascii") for p in parts[2:])
            stanzas.append(Stanza(parts[1].decode("ascii"), args, unb64(b"".join(body_lines))))
        if not stanzas:
            raise DecryptionFailed("age header: no recipient stanza")
        mac = unb64(head[end + 5 : end_line])
        if len(mac) != 32:
            raise DecryptionFailed("age header: malformed MAC")
        return cls(tuple(stanzas), mac, head[: end + 4], end_line + 1)

    def open(self, identities: Sequence[Identity], key_ids: tuple[str, ...] = ()) -> bytes:
        """The file key, unwrapped by one of `identities` and checked against the MAC.

        Args:
            identities: the identities to try.
            key_ids: the recipients' ids the placeholder names, for the error.

        Raises:
            NoMatchingIdentity: none opens a stanza.
            DecryptionFailed: a malformed stanza, or a MAC that does not match.
        """
        for stanza in self.stanzas:
            for identity in identities:
                file_key = identity.unwrap(stanza)
                if file_key is None:
                    continue
                if len(file_key) != 16:
                    raise DecryptionFailed("age header: file key of the wrong size")
                if not hmac.compare_digest(_mac(file_key, self.signed), self.mac):
                    raise DecryptionFailed("age header: MAC mismatch (tampered header)")
                return file_key
        ours = tuple(i.recipient.key_id for i in identities)
        x25519 = sum(1 for s in self.stanzas if s.type == "X25519")
        raise NoMatchingIdentity(key_ids, ours, x25519)


def encode_header(file_key: bytes, recipients: Iterable[Recipient]) -> bytes:
    """A header wrapping `file_key` for each recipient, with its MAC line."""
    stanzas = [_stanza_bytes(wrap(file_key, r)) for r in recipients]
    if not stanzas:
        raise ValueError("encryption needs at least one recipient")
    signed = MAGIC + b"".join(stanzas) + b"---"
    return signed + b" " + b64(_mac(file_key, signed)) + b"\n"
