"""Bech32 (BIP 173), the text form of age's keys: `age1...` and `AGE-SECRET-KEY-1...`. Pure.

age uses the original Bech32 checksum (not Bech32m) and lifts BIP 173's 90-character limit;
everything else (one case per string, the last `1` separating the human-readable part) is
as specified. Decoding is bounded: keys are short, so longer input is refused before work.
"""

from __future__ import annotations

_CHARSET = "qpzry9x8gf2tvdw0s3jn54khce6mua7l"
_VALUES = {c: i for i, c in enumerate(_CHARSET)}
_GENERATOR = (0x3B6A57B2, 0x26508E6D, 0x1EA119FA, 0x3D4233DD, 0x2A1462B3)
MAX_BECH32 = 256  # an age key is 62 or 74 characters


def _polymod(values: list[int]) -> int:
    chk = 1
    for value in values:
        top = chk >> 25
        chk = (chk & 0x1FFFFFF) << 5 ^ value
        for i, gen in enumerate(_GENERATOR):
            if (top >> i) & 1:
                chk ^= gen
    return chk


def _hrp_expand(hrp: str) -> list[int]:
    return [ord(c) >> 5 for c in hrp] + [0] + [ord(c) & 31 for c in hrp]


def _convert(data: bytes | list[int], source: int, target: int, pad: bool) -> list[int]:
    acc = bits = 0
    out: list[int] = []
    mask = (1 << target) - 1
    for value in data:
        acc = (acc << source) | value
        bits += source
        while bits >= target:
            bits -= target
            out.append((acc >> bits) & mask)
    if pad:
        if bits:
            out.append((acc << (target - bits)) & mask)
    elif bits >= source or (acc << (target - bits)) & mask:
        raise ValueError("bech32: non-zero padding")
    return out


def encode(hrp: str, data: bytes) -> str:
    """`data` under the human-readable part `hrp` (lowercase; callers upper() if they like)."""
    hrp = hrp.lower()
    words = _convert(data, 8, 5, True)
    checksum = _polymod([*_hrp_expand(hrp), *words, 0, 0, 0, 0, 0, 0]) ^ 1
    words += [(checksum >> 5 * (5 - i)) & 31 for i in range(6)]
    return hrp + "1" + "".join(_CHARSET[w] for w in words)


def decode(text: str) -> tuple[str, bytes]:
    """The human-readable part (lowercase) and the data of a Bech32 string.

    Raises:
        ValueError: not Bech32, mixed case, or a bad checksum.
    """
    if len(text) > MAX_BECH32:
        raise ValueError("bech32: too long")
    if text != text.lower() and text != text.upper():
        raise ValueError("bech32: mixed case")
    text = text.lower()
    sep = text.rfind("1")
    if sep < 1 or sep + 7 > len(text):
        raise ValueError("bech32: no separator or no checksum")
    hrp, rest = text[:sep], text[sep + 1 :]
    if any(not 33 <= ord(c) <= 126 for c in hrp):
        raise ValueError("bech32: invalid human-readable part")
    try:
        words = [_VALUES[c] for c in rest]
    except KeyError:
        raise ValueError("bech32: invalid character") from None
    if _polymod(_hrp_expand(hrp) + words) != 1:
        raise ValueError("bech32: bad checksum")
    return hrp, bytes(_convert(words[:-6], 5, 8, False))
