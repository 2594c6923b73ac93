"""The `offload` command line's encryption parts: `keygen`, the flags, and decoding fetches.

    offload keygen -o key.txt            # writes the identity (0600), prints its age1... key
    offload publish -t T -f F --encrypt-to age1... [--encrypt-to age1...] [--no-compress]
    offload subscribe -t T --identity key.txt [--identity old.txt]
    offload fetch URL --identity key.txt  # decrypted and decompressed; --raw: stored bytes

`offload fetch URL` without `--placeholder` has no placeholder, so it tells an age file by its
first line and our zstd frames by their leading skippable frame; an age file without
`--identity` (or `identity_files`) is an error that says so (how many recipients its header
names), never ciphertext written as if it were the payload. `--raw` writes the stored bytes as
they are.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, cast

from ._errors import EXIT_OK

if TYPE_CHECKING:
    from ..config._settings import ClientSettings
    from ..protocol._age_keys import Identity


def add_keygen(sub: Any) -> None:
    """The `keygen` subcommand on `sub` (the parser's subparsers)."""
    keygen = sub.add_parser("keygen", help="make an age identity (X25519) for encrypted topics")
    keygen.add_argument(
        "-o", "--output", type=Path, help="identity file to create (default: stdout)"
    )


def add_encrypt_flag(parser: argparse.ArgumentParser) -> None:
    """`--encrypt-to`, for the commands that send a payload (`publish`, `upload`)."""
    parser.add_argument(
        "--encrypt-to",
        action="append",
        metavar="RECIPIENT",
        help="encrypt the payload to this age1... recipient (repeatable); it is then offloaded",
    )


def add_publish_flags(pub: argparse.ArgumentParser) -> None:
    add_encrypt_flag(pub)
    pub.add_argument(
        "--compress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="zstd-compress where it pays (default: on, off for encrypted payloads)",
    )


def add_identity_flags(parser: argparse.ArgumentParser, *, raw: bool = False) -> None:
    parser.add_argument(
        "--identity",
        "-i",
        action="append",
        type=Path,
        metavar="FILE",
        help="age identity file for encrypted payloads (repeatable)",
    )
    if raw:
        parser.add_argument(
            "--raw", action="store_true", help="write the stored bytes (no decrypt/decompress)"
        )
        parser.add_argument(
            "--range",
            metavar="START-END",
            help="only these bytes (inclusive) of the payload; of an encrypted one, only the "
            "64 KiB chunks that hold them are fetched and decrypted",
        )


def setting_flags(args: argparse.Namespace) -> dict[str, object]:
    """The settings these flags set (None: not given, the lower layers decide)."""
    flags: dict[str, object] = {"compress": getattr(args, "compress", None)}
    if getattr(args, "encrypt_to", None):
        flags["encrypt_to"] = ((args.topic, tuple(args.encrypt_to)),)
    if getattr(args, "identity", None):
        flags["identity_files"] = tuple(str(p) for p in args.identity)
    return flags


def keygen(args: argparse.Namespace) -> int:
    from ..config._keys import keygen as make

    identity, text = make(args.output)
    if args.output is None:
        sys.stdout.write(text)
        print(f"Public key: {identity.recipient}", file=sys.stderr)
    else:
        print(identity.recipient)
    return EXIT_OK


@contextlib.contextmanager
def decoding_writer(
    args: argparse.Namespace, settings: ClientSettings, out: BinaryIO
) -> Iterator[BinaryIO]:
    """`out` wrapped so that what is written into it is decoded (as is with `--raw`): the
    stored bytes of `offload fetch URL` in, the payload out."""
    if args.raw:
        yield out
        return
    from ..seal._unseal import Unsealer

    unsealer = Unsealer(settings)  # reads identity_files: a bad one is an error now
    writer = DecodingWriter(out, unsealer.identities, settings.max_fetch_bytes)
    yield cast(BinaryIO, writer)
    writer.close()  # only on success: the end of the stored bytes, or an error


class DecodingWriter:
    """A writable file that decodes what is written into it (sniffing age and our zstd).

    Args:
        out: where the plaintext goes.
        identities: for an age file.
        limit: the most plaintext bytes.
    """

    def __init__(self, out: BinaryIO, identities: Sequence[Identity], limit: int) -> None:
        from ..protocol._encoding import PLAIN
        from ..seal._unseal import Decoder

        self._out = out
        self._decoder = Decoder(PLAIN, identities, limit, sniff=True)

    @property
    def size(self) -> int:
        """Plaintext bytes written so far."""
        return self._decoder.size

    def write(self, data: bytes) -> int:
        for piece in self._decoder.feed(bytes(data)):
            self._out.write(piece)
        return len(data)

    def close(self) -> None:
        """The end of the stored bytes: the rest, or an error when they were incomplete."""
        for piece in self._decoder.finish():
            self._out.write(piece)

    def flush(self) -> None:
        self._out.flush()
