"""Keys at the edge: the `encrypt_to` setting's forms, identity files, `offload keygen`.

`encrypt_to` maps topic filters to age recipients. In the config file it is a table::

    [client.encrypt_to]
    "sensors/#" = ["age1...", "age1..."]

in `OFFLOAD_ENCRYPT_TO` (and as a string anywhere) `FILTER=RECIPIENT,RECIPIENT;FILTER=...`.
Either becomes a tuple of `(filter, (recipient, ...))` pairs, checked once: a recipient that
is not `age1...` or a filter that is not one is a :class:`ConfigError`.

Identity files are age-keygen's format. They are read once, when a client starts, and a
file that cannot be read or holds no identity is a ConfigError naming the file (never the
key).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from ..core._exceptions import ConfigError, InvalidTopic
from ..protocol import TopicFilter

if TYPE_CHECKING:  # cryptography loads when a key is used, not with the settings
    from ..protocol._age_keys import Identity, Recipient

EncryptTo = tuple[tuple[str, tuple[str, ...]], ...]
MAX_IDENTITY_FILE = 64 * 1024


def parse_encrypt_to(text: str) -> EncryptTo:
    """`FILTER=RECIPIENT,RECIPIENT;FILTER=...` (the environment's form)."""
    pairs: dict[str, list[str]] = {}
    for entry in (e.strip() for e in text.split(";")):
        if not entry:
            continue
        topic_filter, sep, recipients = entry.rpartition("=")
        if not sep or not topic_filter.strip():
            raise ValueError(f"encrypt_to entry {entry[:80]!r} is not FILTER=RECIPIENT[,...]")
        pairs.setdefault(topic_filter.strip(), []).extend(
            r.strip() for r in recipients.split(",") if r.strip()
        )
    return normalise_encrypt_to(pairs)


def normalise_encrypt_to(value: object) -> EncryptTo:
    """Any accepted form (a string, a TOML table, pairs) as checked pairs.

    Raises:
        ConfigError: a malformed filter or recipient, or a filter without recipients.
    """
    if isinstance(value, str):
        try:
            return parse_encrypt_to(value)
        except ValueError as exc:
            raise ConfigError(f"encrypt_to: {exc}") from None
    items: Iterable[tuple[object, object]]
    if isinstance(value, Mapping):
        items = value.items()
    elif isinstance(value, tuple | list):
        items = value
    else:
        raise ConfigError("encrypt_to must map topic filters to lists of age1... recipients")
    out = []
    for topic_filter, recipients in items:
        if isinstance(recipients, str):
            recipients = [recipients]
        if not isinstance(topic_filter, str) or not isinstance(recipients, list | tuple):
            raise ConfigError("encrypt_to must map topic filters to lists of age1... recipients")
        try:
            TopicFilter(topic_filter)
        except InvalidTopic as exc:
            raise ConfigError(f"encrypt_to: {exc}") from None
        if not recipients:
            raise ConfigError(f"encrypt_to: {topic_filter!r} has no recipient")
        from ..protocol._age_keys import Recipient

        checked = []
        for recipient in recipients:
            try:
                checked.append(str(Recipient.parse(str(recipient))))
            except ValueError as exc:
                raise ConfigError(f"encrypt_to {topic_filter!r}: {exc}") from None
        out.append((topic_filter, tuple(checked)))
    return tuple(out)


def recipients_for(encrypt_to: EncryptTo, topic: str) -> list[Recipient]:
    """Every recipient of every filter that matches `topic` (none: not encrypted)."""
    from ..protocol._age_keys import Recipient

    found: dict[str, Recipient] = {}
    for topic_filter, recipients in encrypt_to:
        if TopicFilter(topic_filter).matches(topic):
            for text in recipients:
                found.setdefault(text, Recipient.parse(text))
    return list(found.values())


def load_identities(paths: Iterable[str | os.PathLike[str]]) -> list[Identity]:
    """The identities of every file, in order.

    Raises:
        ConfigError: a file that cannot be read or holds something else.
    """
    paths = list(paths)
    if not paths:
        return []
    from ..protocol._age_keys import parse_identities

    identities: list[Identity] = []
    for path in paths:
        try:
            with open(os.path.expanduser(path), "rb") as f:
                data = f.read(MAX_IDENTITY_FILE + 1)
        except OSError as exc:
            raise ConfigError(f"identity file {path}: {exc.strerror or exc}") from None
        if len(data) > MAX_IDENTITY_FILE:
            raise ConfigError(f"identity file {path}: larger than {MAX_IDENTITY_FILE} bytes")
        try:
            identities.extend(parse_identities(data.decode("utf-8")))
        except (UnicodeDecodeError, ValueError) as exc:
            raise ConfigError(f"identity file {path}: {exc}") from None
    return identities


def keygen(path: Path | None) -> tuple[Identity, str]:
    """A new identity, written to `path` (mode 0600, never over an existing file) or
    returned as text when `path` is None; and the file's text.

    Raises:
        OSError: `path` exists or cannot be written.
    """
    from ..protocol._age_keys import Identity

    identity = Identity.generate()
    created = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    text = f"# created: {created}\n# public key: {identity.recipient}\n{identity}\n"
    if path is not None:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(text)
    return identity, text
