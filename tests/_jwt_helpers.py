"""Keys made in the test, JWKS documents, signed tokens, and a JWKS server that can misbehave."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import jwt
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from jwt.algorithms import ECAlgorithm, OKPAlgorithm, RSAAlgorithm

ISSUER = "https://idp.example"
AUDIENCE = "mqtt-offload"


@dataclass
class SigningKey:
    """A private key, its algorithm and key id."""

    alg: str
    kid: str
    private: Any

    def jwk(self) -> dict[str, Any]:
        public = self.private.public_key()
        exporter = {"RS256": RSAAlgorithm, "ES256": ECAlgorithm, "EdDSA": OKPAlgorithm}[self.alg]
        doc: dict[str, Any] = json.loads(exporter.to_jwk(public))
        doc.update(kid=self.kid, use="sig", alg=self.alg)
        return doc

    def sign(self, claims: dict[str, Any], **header: Any) -> str:
        return jwt.encode(
            claims, self.private, algorithm=self.alg, headers={"kid": self.kid, **header}
        )


def make_key(alg: str, kid: str) -> SigningKey:
    if alg == "RS256":
        private: Any = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    elif alg == "ES256":
        private = ec.generate_private_key(ec.SECP256R1())
    else:
        private = ed25519.Ed25519PrivateKey.generate()
    return SigningKey(alg, kid, private)


def jwks(*keys: SigningKey) -> str:
    return json.dumps({"keys": [key.jwk() for key in keys]})


def claims(sub: str, *, ttl: float = 300, **extra: Any) -> dict[str, Any]:
    now = int(time.time())
    return {"sub": sub, "iss": ISSUER, "aud": AUDIENCE, "iat": now, "exp": now + ttl, **extra}


@dataclass
class JwksServer:
    """Serves `body` at /jwks.json; `delay` seconds before answering (a hanging IdP)."""

    body: bytes = b""
    delay: float = 0.0
    hits: int = 0
    port: int = 0
    _server: ThreadingHTTPServer | None = field(default=None, repr=False)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/jwks.json"


@contextmanager
def jwks_server(body: str) -> Iterator[JwksServer]:
    state = JwksServer(body=body.encode())

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            state.hits += 1
            time.sleep(state.delay)
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(state.body)))
            self.end_headers()
            self.wfile.write(state.body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    state.port = server.server_address[1]
    state._server = server
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield state
    finally:
        state.delay = 0
        server.shutdown()
        server.server_close()
