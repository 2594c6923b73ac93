"""client/_unseal.Decoder: placeholder-driven and sniffing decoding, any splits, hostile bytes."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from client.core._exceptions import PayloadDecodeError
from client.protocol._age import encrypt
from client.protocol._age_keys import Identity
from client.protocol._encoding import PLAIN, Encoding
from client.protocol._zstd import compress
from client.seal._unseal import Decoder

KEY = Identity.generate()
#: How an age file and our zstd frames begin: what sniffing decodes.
MAGICS = (b"age-encryption.org/v1\n", b"\x5e\x2a\x4d\x18")


def _run(decoder: Decoder, data: bytes, cuts: list[int]) -> bytes:
    out, last = [], 0
    for cut in [*sorted(c % (len(data) + 1) for c in cuts), len(data)]:
        out.extend(decoder.feed(data[last:cut]))
        last = cut
    out.extend(decoder.finish())
    return b"".join(out)


@settings(max_examples=200, deadline=None)
@given(data=st.binary(max_size=3000), cuts=st.lists(st.integers(0, 5000), max_size=5))
def test_sniffing_passes_any_other_bytes_through_unchanged(data: bytes, cuts: list[int]) -> None:
    try:
        out = _run(Decoder(PLAIN, [KEY], 10**6, sniff=True), data, cuts)
    except PayloadDecodeError:
        # Only bytes that start like an age file or our zstd frames are decoded at all.
        assert data.startswith(MAGICS)
        return
    if not data.startswith(MAGICS):
        assert out == data


@settings(max_examples=60, deadline=None)
@given(
    data=st.binary(max_size=200_000),
    cuts=st.lists(st.integers(0, 1 << 20), max_size=5),
    squeeze=st.booleans(),
    seal=st.booleans(),
)
def test_every_encoding_round_trips_by_placeholder_and_by_sniffing(
    data: bytes, cuts: list[int], squeeze: bool, seal: bool
) -> None:
    stored = compress(data) if squeeze else data
    stored = encrypt(stored, [KEY.recipient]) if seal else stored
    encoding = Encoding(compressed=squeeze, encrypted=seal)
    assert _run(Decoder(encoding, [KEY], 10**6), stored, cuts) == data
    if encoding == PLAIN and data.startswith(MAGICS):
        return  # plain bytes that look like an encoding: sniffing decodes them (above)
    assert _run(Decoder(PLAIN, [KEY], 10**6, sniff=True), stored, cuts) == data
