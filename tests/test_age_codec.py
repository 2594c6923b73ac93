"""The age v1 codec (client/protocol/_age.py): round trips, peers, damage, hostile headers.

Peers are independent implementations: `pyrage` (rage, in Rust) and Debian's `age` (the
reference, in Go). Every age file we write is read by both, and every file they write is
read by ours.
"""

from __future__ import annotations

import base64
import contextlib
import os
import shutil
import subprocess
from pathlib import Path

import pyrage
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from client.protocol._age import (
    CHUNK,
    SEALED_CHUNK,
    Decryptor,
    Encryptor,
    Layout,
    OpenedHeader,
    decrypt,
    encrypt,
)
from client.protocol._age_header import MAX_HEADER, MAX_STANZAS, Header
from client.protocol._age_keys import Identity, Recipient, parse_identities
from client.protocol._bech32 import decode as bech32_decode
from client.protocol._errors import DecryptionFailed, NoMatchingIdentity

AGE = shutil.which("age")
needs_age = pytest.mark.skipif(AGE is None, reason="Debian's age is not installed")
ALICE = Identity.generate()
BOB = Identity.generate()
EDGE_SIZES = [0, 1, CHUNK - 1, CHUNK, CHUNK + 1, 2 * CHUNK, 2 * CHUNK + 1, 3 * CHUNK - 7]


def _streamed(data: bytes, cuts: list[int], recipients: list[Recipient]) -> bytes:
    enc, out, last = Encryptor(recipients), [], 0
    for cut in [*sorted(c % (len(data) + 1) for c in cuts), len(data)]:
        out.append(enc.feed(data[last:cut]))
        last = cut
    return b"".join(out) + enc.finish()


def _destreamed(blob: bytes, cuts: list[int], identities: list[Identity]) -> bytes:
    dec, out, last = Decryptor(identities), [], 0
    for cut in [*sorted(c % (len(blob) + 1) for c in cuts), len(blob)]:
        out.append(dec.feed(blob[last:cut]))
        last = cut
    return b"".join(out) + dec.finish()


@pytest.mark.parametrize("size", EDGE_SIZES)
def test_round_trip_at_chunk_edges_two_recipients(size: int) -> None:
    data = os.urandom(size)
    blob = encrypt(data, [ALICE.recipient, BOB.recipient])
    assert decrypt(blob, [ALICE]) == data
    assert decrypt(blob, [BOB]) == data
    chunks = max(1, -(-size // CHUNK))
    assert len(blob) == Header.parse(blob).length + 16 + size + 16 * chunks  # type: ignore[union-attr]


@settings(max_examples=60, deadline=None)
@given(
    size=st.integers(0, 4 * CHUNK + 3),
    cuts=st.lists(st.integers(0, 1 << 20), max_size=6),
    decuts=st.lists(st.integers(0, 1 << 20), max_size=6),
)
def test_streaming_any_split_round_trips(size: int, cuts: list[int], decuts: list[int]) -> None:
    data = os.urandom(size)
    blob = _streamed(data, cuts, [ALICE.recipient])
    assert _destreamed(blob, decuts, [BOB, ALICE]) == data
    assert pyrage.decrypt(blob, [pyrage.x25519.Identity.from_str(str(ALICE))]) == data


@settings(max_examples=40, deadline=None)
@given(
    size=st.integers(0, 5 * CHUNK + 3),
    cuts=st.lists(st.integers(0, 6 * SEALED_CHUNK), max_size=6),
)
def test_feed_into_decrypts_in_place_what_feed_pieces_gives(size: int, cuts: list[int]) -> None:
    """Decryptor.feed_into (the receive path's decryption straight into the payload's
    buffer) writes the same plaintext, split anywhere, once the header is read."""
    data = os.urandom(size)
    blob = encrypt(data, [ALICE.recipient])
    dec, out, at, last = Decryptor([ALICE]), bytearray(size), 0, 0
    view = memoryview(out)
    with pytest.raises(ValueError, match="before the header"):
        dec.feed_into(blob[:10], view)
    dec = Decryptor([ALICE])
    for cut in [*sorted(c % (len(blob) + 1) for c in cuts), len(blob)]:
        piece, last = blob[last:cut], cut
        if dec.header_length is None:
            for plain in dec.feed_pieces(piece):
                view[at : at + len(plain)] = plain
                at += len(plain)
        else:
            at += dec.feed_into(piece, view[at:])
    final = dec.finish()
    view[at : at + len(final)] = final
    assert at + len(final) == size and bytes(out) == data


def test_feed_into_refuses_tampered_chunks_and_chunks_past_its_room() -> None:
    data = os.urandom(3 * CHUNK + 5)
    blob = bytearray(encrypt(data, [ALICE.recipient]))
    start = len(blob) - (3 * SEALED_CHUNK + 5 + 16)  # the payload after header and nonce
    dec = Decryptor([ALICE])
    dec.feed(bytes(blob[:start]))
    with pytest.raises(DecryptionFailed, match="more chunks than its size holds"):
        dec.feed_into(bytes(blob[start:]), memoryview(bytearray(2 * CHUNK)))
    blob[start + SEALED_CHUNK + 7] ^= 1  # inside chunk 1
    dec = Decryptor([ALICE])
    dec.feed(bytes(blob[:start]))
    with pytest.raises(DecryptionFailed, match="chunk 1 fails authentication"):
        dec.feed_into(bytes(blob[start:]), memoryview(bytearray(len(data))))


@settings(max_examples=30, deadline=None)
@given(size=st.integers(0, 4 * CHUNK + 3), cuts=st.lists(st.integers(0, 1 << 19), max_size=6))
def test_feed_seals_into_one_object_the_bytes_feed_pieces_gives(size: int, cuts: list[int]) -> None:
    """Encryptor.feed (each chunk sealed straight into one output object) and the join
    of feed_pieces are the same age payload for the same file key and nonce."""
    data = os.urandom(size)
    key, nonce = os.urandom(16), os.urandom(16)
    one, many = (Encryptor([ALICE.recipient], file_key=key, nonce=nonce) for _ in range(2))
    a, b, last = [], [], 0
    for cut in [*sorted(c % (size + 1) for c in cuts), size]:
        a.append(one.feed(data[last:cut]))
        b.extend(many.feed_pieces(data[last:cut]))
        last = cut
    a.append(one.finish())
    b.append(many.finish())
    ours, theirs = b"".join(a), b"".join(b)
    # Each header wraps the key with a fresh ephemeral share: the payloads must match.
    assert ours[one.header_length :] == theirs[many.header_length :]
    assert decrypt(ours, [ALICE]) == data


def test_output_is_bounded_while_streaming() -> None:
    enc = Encryptor([ALICE.recipient])
    dec = Decryptor([ALICE])
    piece = os.urandom(1 << 20)
    for _ in range(8):
        sealed = enc.feed(piece)
        assert len(enc._buffer) <= CHUNK
        plain = dec.feed(sealed)
        assert len(dec._buffer) <= SEALED_CHUNK
        assert len(plain) <= 1 << 20
    dec.feed(enc.finish())
    dec.finish()


@pytest.mark.parametrize("size", [0, 100, CHUNK, CHUNK * 3 + 5])
def test_pyrage_reads_ours_and_we_read_pyrage(size: int) -> None:
    data = os.urandom(size)
    theirs = pyrage.x25519.Identity.generate()
    ours_for_them = Recipient.parse(str(theirs.to_public()))
    assert pyrage.decrypt(encrypt(data, [ALICE.recipient, ours_for_them]), [theirs]) == data
    to_alice = pyrage.x25519.Recipient.from_str(str(ALICE.recipient))
    assert decrypt(pyrage.encrypt(data, [to_alice]), [ALICE]) == data
    # Keys in text: ours parse theirs and the other way round.
    assert str(Identity.parse(str(theirs)).recipient) == str(theirs.to_public())
    assert str(pyrage.x25519.Identity.from_str(str(ALICE)).to_public()) == str(ALICE.recipient)


@needs_age
@pytest.mark.parametrize("size", [0, CHUNK, 3 * CHUNK + 1])
def test_age_cli_reads_ours_and_we_read_its(size: int, tmp_path: Path) -> None:
    assert AGE is not None
    data = os.urandom(size)
    key = tmp_path / "key.txt"
    key.write_text(f"# a comment\n\n{ALICE}\n")
    out = subprocess.run(
        [AGE, "-d", "-i", str(key)],
        input=encrypt(data, [ALICE.recipient]),
        capture_output=True,
        check=True,
    )
    assert out.stdout == data
    sealed = subprocess.run(
        [AGE, "-r", str(ALICE.recipient), "-r", str(BOB.recipient)],
        input=data,
        capture_output=True,
        check=True,
    ).stdout
    assert decrypt(sealed, [BOB]) == data


@needs_age
def test_age_keygen_identity_file_is_read(tmp_path: Path) -> None:
    keygen = shutil.which("age-keygen")
    assert keygen is not None
    key = tmp_path / "k"
    subprocess.run([keygen, "-o", str(key)], check=True, capture_output=True)
    (identity,) = parse_identities(key.read_text())
    public = next(line.split(": ")[1] for line in key.read_text().splitlines() if "public" in line)
    assert str(identity.recipient) == public


def test_wrong_identity_names_the_key_ids() -> None:
    blob = encrypt(b"secret", [ALICE.recipient])
    with pytest.raises(NoMatchingIdentity) as caught:
        Decryptor([BOB], key_ids=(ALICE.recipient.key_id,)).feed(blob)
    assert caught.value.key_ids == (ALICE.recipient.key_id,)
    assert caught.value.own_key_ids == (BOB.recipient.key_id,)
    assert ALICE.recipient.key_id in str(caught.value)
    with pytest.raises(NoMatchingIdentity, match="1 X25519 recipient"):
        decrypt(blob, [BOB])
    none_given = r"1 X25519 recipient \(unnamed\); ours: none given"
    with pytest.raises(NoMatchingIdentity, match=none_given):
        decrypt(blob, [])


def test_every_truncation_fails() -> None:
    data = os.urandom(2 * CHUNK + 10)
    blob = encrypt(data, [ALICE.recipient])
    header = Header.parse(blob)
    assert header is not None
    cuts = [0, 5, header.length - 1, header.length + 16, header.length + 16 + 8]
    cuts += [header.length + 16 + SEALED_CHUNK, header.length + 16 + 2 * SEALED_CHUNK]
    cuts += [len(blob) - 1]
    for cut in cuts:
        with pytest.raises(DecryptionFailed):
            decrypt(blob[:cut], [ALICE])


def test_every_tampered_byte_region_fails() -> None:
    data = os.urandom(CHUNK + 10)
    blob = encrypt(data, [ALICE.recipient])
    header = Header.parse(blob)
    assert header is not None
    # version line, stanza argument, stanza body, MAC, nonce, first chunk, last tag
    spots = [3, 30, header.length - 60, header.length - 5, header.length + 3]
    spots += [header.length + 16 + 100, len(blob) - 1]
    for spot in spots:
        damaged = bytearray(blob)
        damaged[spot] ^= 0x01
        with pytest.raises((DecryptionFailed, NoMatchingIdentity)):
            decrypt(bytes(damaged), [ALICE])
    with pytest.raises(DecryptionFailed):  # a trailing byte: the last chunk is not last
        decrypt(blob + b"x", [ALICE])


def test_swapped_chunks_fail() -> None:
    blob = encrypt(os.urandom(3 * CHUNK), [ALICE.recipient])
    start = Header.parse(blob).length + 16  # type: ignore[union-attr]
    one, two = (blob[start + i * SEALED_CHUNK : start + (i + 1) * SEALED_CHUNK] for i in (0, 1))
    swapped = blob[:start] + two + one + blob[start + 2 * SEALED_CHUNK :]
    with pytest.raises(DecryptionFailed, match="chunk 0"):
        decrypt(swapped, [ALICE])


def _header(*stanza_lines: str, mac: str = "A" * 43) -> bytes:
    return ("age-encryption.org/v1\n" + "".join(stanza_lines) + f"--- {mac}\n").encode()


HOSTILE = {
    "not age": b"hello world, this is not an age file at all\n--- x\n" + bytes(16),
    "other version": b"age-encryption.org/v2\n-> X25519 a\nAA\n--- " + b"A" * 43 + b"\n",
    "no stanza": _header(),
    "bad arrow": _header("=> X25519 abc\nAAAA\n"),
    "empty argument": _header("-> X25519  abc\nAAAA\n"),
    "body not ended": _header("-> X25519 abc\n" + "A" * 64 + "\n"),
    "body line too long": _header("-> X25519 abc\n" + "A" * 65 + "\n"),
    "padded base64": _header("-> X25519 abc\nAA==\n"),
    "non-canonical base64": _header("-> X25519 abc\nAB\n"),
    "bad mac": _header("-> X25519 abc\nAA\n", mac="!!"),
    "x25519 without argument": _header("-> X25519\nAA\n"),
    "x25519 short share": _header("-> X25519 AAAA\n" + "A" * 43 + "\n"),
    "x25519 low-order share": _header("-> X25519 " + "A" * 43 + "\n" + "A" * 43 + "\n"),
    "too many stanzas": _header(*["-> grease x\n\n"] * (MAX_STANZAS + 1)),
    "header too long": b"age-encryption.org/v1\n" + b"-> x\n" + b"A" * MAX_HEADER,
    "non-ascii": _header("-> X25519 \xff\nAA\n"),
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_headers_are_decryption_failures(name: str) -> None:
    with pytest.raises(DecryptionFailed):
        dec = Decryptor([ALICE])
        dec.feed(HOSTILE[name] + bytes(64))
        dec.finish()


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=600))
def test_any_bytes_fail_cleanly(blob: bytes) -> None:
    for data in (blob, b"age-encryption.org/v1\n" + blob):
        with contextlib.suppress(DecryptionFailed, NoMatchingIdentity):
            decrypt(data, [ALICE])


def test_unknown_stanzas_are_skipped() -> None:
    blob = encrypt(b"payload", [ALICE.recipient])
    first_arrow = blob.index(b"\n-> ") + 1
    grease = b"-> grease-x y z\n" + base64.b64encode(b"g" * 48).rstrip(b"=") + b"\n\n"
    # The MAC covers the header, so a stanza put in afterwards is tampering...
    with pytest.raises(DecryptionFailed, match="MAC"):
        decrypt(blob[:first_arrow] + grease + blob[first_arrow:], [ALICE])
    # ...while one age wrote itself is read past: pyrage adds grease stanzas.
    to_alice = pyrage.x25519.Recipient.from_str(str(ALICE.recipient))
    for _ in range(5):
        assert decrypt(pyrage.encrypt(b"payload", [to_alice]), [ALICE]) == b"payload"


@pytest.mark.parametrize(
    ("start", "end"), [(0, 1), (CHUNK - 1, CHUNK + 1), (CHUNK, 2 * CHUNK), (3 * CHUNK, 10**9)]
)
def test_range_decrypts_only_its_chunks(start: int, end: int) -> None:
    data = os.urandom(3 * CHUNK + 99)
    blob = encrypt(data, [ALICE.recipient])
    header = Header.parse(blob)
    assert header is not None
    layout = Layout.of(header.length, len(blob))
    assert layout.plain_size == len(data)
    a, b, first = layout.span(start, end)
    opened = OpenedHeader(header, blob[header.length : header.length + 16], [ALICE])
    plain = opened.open_run(first, blob[a:b], layout)
    assert (b - a) <= 2 * SEALED_CHUNK
    offset = start - first * CHUNK
    assert plain[offset : offset + min(end, len(data)) - start] == data[start:end]


def test_a_range_cannot_pass_a_middle_chunk_off_as_the_last() -> None:
    blob = encrypt(os.urandom(2 * CHUNK), [ALICE.recipient])
    header = Header.parse(blob)
    assert header is not None
    opened = OpenedHeader(header, blob[header.length : header.length + 16], [ALICE])
    first = blob[header.length + 16 : header.length + 16 + SEALED_CHUNK]
    with pytest.raises(DecryptionFailed):
        opened.open_chunk(0, first, True)


def test_keys_in_text() -> None:
    text = str(ALICE)
    assert text.startswith("AGE-SECRET-KEY-1") and text == text.upper()
    assert Identity.parse(text) == ALICE
    assert text not in repr(ALICE)
    recipient = str(ALICE.recipient)
    assert recipient.startswith("age1") and Recipient.parse(recipient) == ALICE.recipient
    assert bech32_decode(recipient)[0] == "age"
    # The last character changed (to one it is not: a random key ends in "x" 1 time in 32).
    changed = recipient[:-1] + ("q" if recipient[-1] != "q" else "p")
    for bad in ["", "age1", changed, recipient.upper()[:10], text.lower(), "x" * 999]:
        with pytest.raises(ValueError):
            Recipient.parse(bad)
    with pytest.raises(ValueError):
        Identity.parse(recipient)
    with pytest.raises(ValueError, match="line 2"):
        parse_identities(f"# x\n{recipient}\n")
    with pytest.raises(ValueError, match="no AGE-SECRET-KEY"):
        parse_identities("# only comments\n")
