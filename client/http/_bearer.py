"""Whether a broker password is a JWT, told by its shape alone (no JOSE library).

Brokers that take JWTs (EMQX, HiveMQ, mosquitto-go-auth, cloud authorizers) take them as the
MQTT password. When the password a client logs in with has a JWS's compact shape, the
gateway gets it as ``Authorization: Bearer`` instead of SCRAM: the gateway verifies it and
the device's claims decide there as they do at the broker. The client never verifies it:
it holds no keys, and the gateway does.
"""

from __future__ import annotations

import base64
import binascii
import json
import re

_PART = re.compile(r"[A-Za-z0-9_-]+")
#: A header larger than this is no JWS header a client would be handed.
_MAX_HEADER = 2048


def looks_like_jwt(text: str | None) -> bool:
    """Whether ``text`` is shaped like a signed JWT: three base64url parts, the first a JSON
    object naming an ``alg``.

    Args:
        text: a password or token.
    """
    if not text or text.count(".") != 2:
        return False
    header, payload, signature = text.split(".")
    if not (_PART.fullmatch(header) and _PART.fullmatch(payload)) or len(header) > _MAX_HEADER:
        return False
    if signature and not _PART.fullmatch(signature):
        return False
    try:
        doc = json.loads(base64.urlsafe_b64decode(header + "=" * (-len(header) % 4)))
    except (binascii.Error, ValueError):
        return False
    return isinstance(doc, dict) and isinstance(doc.get("alg"), str)
