"""HTTP authentication to the offload gateway: SCRAM (RFC 7804) and bearer tokens (a token
of its own, or a broker password that is a JWT: :mod:`._bearer`).

:class:`ScramAuth` speaks RFC 7804 with hop-client's shortcut (client-first goes out with the
first request, without waiting for a challenge)::

    C: <probe>      Authorization: SCRAM-SHA-512 data=<b64 client-first>
    S: 401          WWW-Authenticate: SCRAM-SHA-512 sid=<sid>, data=<b64 server-first>
    C: <request>    Authorization: SCRAM-SHA-512 sid=<sid>, data=<b64 client-final>
    S: 2xx/403/...  Authentication-Info: sid=<sid>, data=<b64 server-final>

Why a probe: a request body may be a multi-gigabyte file streamed from disk, and an httpx
auth flow that answers a challenge sends its request again. Rather than asking httpx to
buffer the body (`requires_request_body`) or re-opening the source, the first round trip
carries a body-less copy of the request (`Content-Length: 0`, like hop-client's shortcut),
and only the second, authenticated one carries the real body: it is streamed exactly once,
whatever the server answers. A request without a body is its own probe. If a server answers
the probe without a challenge (it does not authenticate), the real request follows once,
without credentials.

The server-final is checked as RFC 5802 requires: a server that cannot prove it knows the
password, a server error (`e=invalid-proof`) or a mismatched `sid` raise :class:`ScramFailure`,
which :class:`client.HttpTransport` turns into an UploadError / FetchError with status 401.

A user whose password entry cannot do SCRAM (fewer than 4096 iterations: every client
`mosquitto_ctrl` makes) gets, from a gateway behind TLS, a 401 to the client-first that
offers HTTP Basic alone. The default login (`gateway_auth`'s `auto`) then sends the request
with Basic, over `https://` only, and keeps to Basic for the later requests of that auth
object; otherwise the failure says what to set.

Each flow has its own scramp state, so one auth object may serve several threads.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Generator
from typing import TYPE_CHECKING

import httpx

from ._bearer import looks_like_jwt

if TYPE_CHECKING:
    from scramp import ScramClient

MECHANISMS = ("SCRAM-SHA-512", "SCRAM-SHA-256")


class ScramFailure(Exception):
    """SCRAM could not authenticate us, or the gateway could not authenticate itself.

    Internal to the client: :class:`client.http._transport.HttpTransport` maps it to UploadError or
    FetchError, so applications only see the client's own error hierarchy.
    """


def _b64(text: str) -> str:
    return base64.b64encode(text.encode("utf-8")).decode("ascii")


def _unb64(data: str) -> str:
    try:
        return base64.b64decode(data, validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError) as exc:
        raise ScramFailure(f"undecodable SCRAM data from the gateway: {exc}") from exc


def _params(text: str) -> dict[str, str]:
    """`name=value, name=value` (RFC 7235 auth-params; base64 values may end in `=`)."""
    out: dict[str, str] = {}
    for item in text.split(","):
        name, sep, value = item.strip().partition("=")
        if sep:
            value = value.strip()
            if len(value) >= 2 and value[0] == value[-1] == '"':
                value = value[1:-1]
            out[name.strip().lower()] = value
    return out


def _challenge(header: str | None, mechanism: str) -> dict[str, str] | None:
    """The parameters of our mechanism's server-first challenge, None if there is none."""
    if not header:
        return None
    scheme, _, rest = header.strip().partition(" ")
    if scheme.upper() != mechanism:
        return None
    params = _params(rest)
    return params if "sid" in params and "data" in params else None


def _offers_basic_alone(response: httpx.Response) -> bool:
    """Whether a 401 to our client-first offers HTTP Basic alone: the gateway's word that
    this user's entry cannot do SCRAM (it offers every scheme it takes otherwise)."""
    if response.status_code != 401:
        return False
    offered = [value.strip() for value in response.headers.get_list("www-authenticate")]
    return len(offered) == 1 and offered[0].partition(" ")[0].lower() == "basic"


def _has_body(request: httpx.Request) -> bool:
    length = request.headers.get("content-length")
    return "transfer-encoding" in request.headers or (length is not None and length != "0")


def _probe(request: httpx.Request) -> httpx.Request:
    """A body-less copy of `request` for the first SCRAM round trip.

    With the original's extensions: httpx keeps a request's timeouts there (and the fetch
    pace its socket hook), so a copy without them would wait for ever on a gateway that
    accepts and never answers (issue 51).
    """
    headers = request.headers.copy()
    headers.pop("transfer-encoding", None)
    headers["Content-Length"] = "0"
    return httpx.Request(
        request.method,
        request.url,
        headers=headers,
        content=b"",
        extensions=dict(request.extensions),
    )


class ScramAuth(httpx.Auth):
    """RFC 7804 HTTP SCRAM for httpx, with hop-client's shortcut; bodies are sent once.

    Args:
        username: the broker user name (the gateway reads the broker's password file).
        password: its password.
        mechanism: `SCRAM-SHA-512` (what mosquitto's sha512-pbkdf2 entries allow) or
            `SCRAM-SHA-256`.
    """

    def __init__(
        self,
        username: str,
        password: str,
        *,
        mechanism: str = "SCRAM-SHA-512",
        basic_fallback: bool = False,
    ) -> None:
        if mechanism.upper() not in MECHANISMS:
            raise ValueError(f"mechanism must be one of {MECHANISMS}, got {mechanism!r}")
        self.username = username
        self._password = password
        self.mechanism = mechanism.upper()
        self.basic_fallback = basic_fallback
        self._basic = False  # the gateway said this user's entry cannot do SCRAM

    def __repr__(self) -> str:
        return f"ScramAuth(username={self.username!r}, mechanism={self.mechanism!r})"

    def auth_flow(self, request: httpx.Request) -> Generator[httpx.Request, httpx.Response, None]:
        # scramp (with asn1crypto) costs 30 ms to import: only a login pays it, not every
        # process that builds a Client (`offload publish` in a shell loop).
        from scramp import ScramClient
        from scramp.utils import ScramException

        if self._basic:  # learnt from an earlier answer of the gateway: no SCRAM round trip
            yield from httpx.BasicAuth(self.username, self._password).auth_flow(request)
            return
        scram = ScramClient([self.mechanism], self.username, self._password)
        probe = _probe(request) if _has_body(request) else request
        probe.headers["Authorization"] = f"{self.mechanism} data={_b64(scram.get_client_first())}"
        response = yield probe
        if response.status_code != 401:
            if probe is not request:
                # No challenge: this server does not authenticate. Send the body, once.
                yield request
            return
        challenge = _challenge(response.headers.get("www-authenticate"), self.mechanism)
        if challenge is None:
            if _offers_basic_alone(response):
                yield from self._basic_instead(request)
            # Refused at client-first (e.g. rate-limited, or SCRAM not offered): the 401 is the
            # answer. It is the probe's, which is fine: the caller only reads its status.
            return
        sid = challenge["sid"]
        try:
            scram.set_server_first(_unb64(challenge["data"]))
            final = scram.get_client_final()
        except ScramException as exc:
            raise ScramFailure(f"bad SCRAM server-first: {exc}") from exc
        request.headers["Authorization"] = f"{self.mechanism} sid={sid}, data={_b64(final)}"
        response = yield request
        self._check_server_final(scram, response, sid)

    def _basic_instead(
        self, request: httpx.Request
    ) -> Generator[httpx.Request, httpx.Response, None]:
        """The gateway said SCRAM cannot serve this user and offered Basic: send the request
        with Basic when allowed (auto, over https://), else say what would work."""
        if not self.basic_fallback:
            raise ScramFailure(
                f"the gateway says the password entry of {self.username!r} cannot do "
                f"{self.mechanism} (fewer than 4096 iterations, as mosquitto_ctrl writes): "
                "log in with HTTP Basic (OFFLOAD_HTTP_LOGIN=basic, or auto)"
            )
        if request.url.scheme != "https":
            raise ScramFailure(
                f"the gateway says the password entry of {self.username!r} cannot do "
                f"{self.mechanism} and offers HTTP Basic, which sends the password as it is: "
                "this client does so only over https://; reach the gateway over HTTPS, or "
                "set OFFLOAD_HTTP_LOGIN=basic to send it anyway"
            )
        self._basic = True
        yield from httpx.BasicAuth(self.username, self._password).auth_flow(request)

    def _check_server_final(self, scram: ScramClient, response: httpx.Response, sid: str) -> None:
        from scramp.utils import ScramException  # loaded already by auth_flow

        info = response.headers.get("authentication-info")
        if info is None:
            if response.status_code < 400:
                raise ScramFailure("the gateway sent no SCRAM server-final: it is not verified")
            return  # e.g. a 401 without server-final: the status tells the caller
        params = _params(info)
        if params.get("sid") != sid or "data" not in params:
            raise ScramFailure("SCRAM server-final does not match this exchange (sid)")
        message = _unb64(params["data"])
        if message.startswith("e="):
            raise ScramFailure(
                f"SCRAM authentication as {self.username!r} failed: {message[2:]} "
                "(wrong user name or password; or, from a gateway on plain HTTP, which cannot "
                "say so, a password entry with fewer than 4096 iterations, as mosquitto_ctrl "
                "and mosquitto_passwd write by default: log in with HTTP Basic over HTTPS, "
                "OFFLOAD_HTTP_LOGIN=basic, or hash it with mosquitto_passwd -I 4096)"
            )
        try:
            scram.set_server_final(message)
        except ScramException as exc:
            raise ScramFailure(
                f"the gateway's SCRAM server signature is wrong ({exc}): it does not know "
                "this user's password, so it is not the gateway it claims to be"
            ) from exc


class BearerAuth(httpx.Auth):
    """`Authorization: Bearer <token>` (the gateway accepts tokens only over TLS).

    Args:
        token: the token; never shown in a repr.
    """

    def __init__(self, token: str) -> None:
        if not token:
            raise ValueError("empty bearer token")
        self._token = token

    def __repr__(self) -> str:
        return "BearerAuth(token=***)"

    def auth_flow(self, request: httpx.Request) -> Generator[httpx.Request, httpx.Response, None]:
        request.headers["Authorization"] = f"Bearer {self._token}"
        yield request


def gateway_auth(
    *, username: str | None, password: str | None, token: str | None, scheme: str = "auto"
) -> httpx.Auth | None:
    """The credentials a client presents to its gateway: a token, else its broker login.

    Args:
        username: the broker user name.
        password: the broker password.
        token: a bearer token; wins over the user name and password.
        scheme: ``auto``: ``token``, else a ``password`` that is a JWT, as a bearer token,
            else SCRAM, and HTTP Basic over https:// where the gateway says the user's
            entry cannot do SCRAM; ``scram``, ``bearer`` (``token``, else ``password``) or
            ``basic`` (the login in clear: for HTTPS only) by name.
    """
    if scheme not in ("auto", "scram", "bearer", "basic"):
        raise ValueError(f"unknown gateway auth scheme {scheme!r}")
    if scheme in ("auto", "bearer") and token:
        return BearerAuth(token)
    if scheme == "bearer" or (scheme == "auto" and looks_like_jwt(password)):
        return BearerAuth(password) if password else None
    if not username or password is None:
        return None
    if scheme == "basic":
        return httpx.BasicAuth(username, password)
    # auto: Basic where the gateway says SCRAM cannot serve the user, over https:// only.
    return ScramAuth(username, password, basic_fallback=scheme == "auto")
