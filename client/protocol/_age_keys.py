"""age's X25519 keys: recipients (`age1...`), identities (`AGE-SECRET-KEY-1...`), stanzas. Pure.

An identity file is age-keygen's: `#` comments and one identity a line. A key's short id
(:func:`key_id`) names it in placeholders and errors without revealing anything new: it is
a hash of the public key. An identity never shows its secret in a repr.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
from dataclasses import dataclass

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305
from cryptography.hazmat.primitives.hashes import SHA256
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from . import _bech32
from ._errors import DecryptionFailed

RECIPIENT_HRP = "age"
IDENTITY_HRP = "age-secret-key-"
_X25519_LABEL = b"age-encryption.org/v1/X25519"
ZERO_NONCE = bytes(12)


def hkdf(ikm: bytes, salt: bytes, info: bytes) -> bytes:
    return HKDF(algorithm=SHA256(), length=32, salt=salt, info=info).derive(ikm)


def b64(data: bytes) -> bytes:
    return base64.b64encode(data).rstrip(b"=")


def unb64(text: bytes) -> bytes:
    """Canonical unpadded base64 (age's rule), or DecryptionFailed."""
    if len(text) % 4 == 1 or b"=" in text:
        raise DecryptionFailed("age header: invalid base64")
    try:
        data = base64.b64decode(text + b"=" * (-len(text) % 4), validate=True)
    except binascii.Error as exc:
        raise DecryptionFailed("age header: invalid base64") from exc
    if b64(data) != text:
        raise DecryptionFailed("age header: non-canonical base64")
    return data


def key_id(public: bytes) -> str:
    """A recipient's short id: the first 8 bytes of SHA-256 of its public key, hex."""
    return hashlib.sha256(public).hexdigest()[:16]


@dataclass(frozen=True, slots=True)
class Recipient:
    """An X25519 recipient (a public key), `age1...` in text."""

    public: bytes

    def __post_init__(self) -> None:
        if len(self.public) != 32:
            raise ValueError("an X25519 recipient is 32 bytes")

    @classmethod
    def parse(cls, text: str) -> Recipient:
        """Read an `age1...` recipient.

        Raises:
            ValueError: not an X25519 age recipient.
        """
        try:
            hrp, data = _bech32.decode(text.strip())
        except ValueError as exc:
            raise ValueError(f"not an age recipient ({exc}): {text[:80]!r}") from None
        if hrp != RECIPIENT_HRP or len(data) != 32 or text.strip() != text.strip().lower():
            raise ValueError(f"not an age X25519 recipient (age1...): {text[:80]!r}")
        return cls(data)

    def __str__(self) -> str:
        return _bech32.encode(RECIPIENT_HRP, self.public)

    @property
    def key_id(self) -> str:
        return key_id(self.public)


@dataclass(frozen=True, slots=True)
class Identity:
    """An X25519 identity (a private key), `AGE-SECRET-KEY-1...` in text. No secret in repr."""

    secret: bytes

    def __post_init__(self) -> None:
        if len(self.secret) != 32:
            raise ValueError("an X25519 identity is 32 bytes")

    def __repr__(self) -> str:
        return f"Identity(recipient={self.recipient})"

    @classmethod
    def generate(cls) -> Identity:
        return cls(os.urandom(32))

    @classmethod
    def parse(cls, text: str) -> Identity:
        """Read an `AGE-SECRET-KEY-1...` identity.

        Raises:
            ValueError: not an X25519 age identity (the message never holds the key).
        """
        text = text.strip()
        try:
            hrp, data = _bech32.decode(text)
        except ValueError as exc:
            raise ValueError(f"not an age identity: {exc}") from None
        if hrp != IDENTITY_HRP or len(data) != 32 or text != text.upper():
            raise ValueError("not an age X25519 identity (AGE-SECRET-KEY-1...)")
        return cls(data)

    def __str__(self) -> str:
        return _bech32.encode(IDENTITY_HRP, self.secret).upper()

    @property
    def recipient(self) -> Recipient:
        key = X25519PrivateKey.from_private_bytes(self.secret)
        return Recipient(key.public_key().public_bytes_raw())

    def unwrap(self, stanza: Stanza) -> bytes | None:
        """The file key, when `stanza` is an X25519 stanza for this identity; else None."""
        if stanza.type != "X25519":
            return None
        if len(stanza.args) != 1:
            raise DecryptionFailed("age header: X25519 stanza needs one argument")
        share = unb64(stanza.args[0].encode())
        if len(share) != 32 or len(stanza.body) != 32:
            raise DecryptionFailed("age header: malformed X25519 stanza")
        private = X25519PrivateKey.from_private_bytes(self.secret)
        try:
            shared = private.exchange(X25519PublicKey.from_public_bytes(share))
        except ValueError as exc:  # a low-order share: all-zero secret
            raise DecryptionFailed("age header: X25519 share of low order") from exc
        ours = private.public_key().public_bytes_raw()
        key = hkdf(shared, share + ours, _X25519_LABEL)
        try:
            return ChaCha20Poly1305(key).decrypt(ZERO_NONCE, stanza.body, None)
        except InvalidTag:
            return None  # for another recipient


def parse_identities(text: str) -> list[Identity]:
    """The identities of an identity file (age-keygen's format: `#` comments, one per line).

    Raises:
        ValueError: a line that is not an X25519 identity, or no identity at all.
    """
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        try:
            found.append(Identity.parse(line))
        except ValueError as exc:
            raise ValueError(f"line {number}: {exc}") from None
    if not found:
        raise ValueError("no AGE-SECRET-KEY-1 identity in the file")
    return found


@dataclass(frozen=True, slots=True)
class Stanza:
    type: str
    args: tuple[str, ...]
    body: bytes


def wrap(file_key: bytes, recipient: Recipient) -> Stanza:
    ephemeral = X25519PrivateKey.generate()
    share = ephemeral.public_key().public_bytes_raw()
    shared = ephemeral.exchange(X25519PublicKey.from_public_bytes(recipient.public))
    key = hkdf(shared, share + recipient.public, _X25519_LABEL)
    body = ChaCha20Poly1305(key).encrypt(ZERO_NONCE, file_key, None)
    return Stanza("X25519", (b64(share).decode(),), body)
