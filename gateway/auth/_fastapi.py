"""FastAPI adapter: dependencies that authenticate, authorize and answer 401/403/429.

The only module of the package that imports FastAPI. Use::

    auth = authenticated(get_authenticator)                  # -> Principal
    can_write = topic_access(get_authenticator, "write")     # checks the {topic} path part

    @app.post("/topic/{topic:path}")
    async def upload(topic: str, principal: Principal = Depends(can_write)): ...

    @app.get("/msg/{msg_id}")
    async def fetch(msg_id: str, principal: Principal = Depends(auth)):
        ...                                   # look up the message's topic, then
        principal.require("read", topic)      # raises 401 / 403

    app.add_middleware(AuthenticationInfoMiddleware)

``Authentication-Info`` (SCRAM's server-final) must reach the client on every answer to a
SCRAM final, errors included: hop-client checks it before it even looks at the status, and
without it reports a broken handshake instead of the route's 403 or 404. The dependency
sets it on FastAPI's ``Response`` parameter (merged into returned responses), puts it on
the HTTPExceptions it raises itself, and leaves it in ``request.state`` where
:class:`AuthenticationInfoMiddleware` adds it to responses built from exceptions raised later.
"""

# No `from __future__ import annotations`: FastAPI must see the real Depends(...) objects
# in the closures' annotations, which name local variables it could not resolve from text.

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from fastapi import Depends, HTTPException, Request, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ._authenticator import Authenticator
from ._decisions import Authenticated, Challenge

Access = Literal["read", "write"]
STATE_KEY = "auth_response_headers"


def _refusal(challenge: Challenge) -> HTTPException:
    return HTTPException(challenge.status, challenge.detail, dict(challenge.headers))


@dataclass(frozen=True)
class Principal:
    """Who is calling (``user`` None: anonymous) and what the gateway may let them do."""

    user: str | None
    authenticator: Authenticator = field(repr=False)
    response_headers: Mapping[str, str] = field(default_factory=dict, repr=False)
    mechanism: str | None = None

    def allowed(self, access: Access, topic: str) -> bool:
        """Whether the ACL lets this caller read or write ``topic``.

        Args:
            access: "read" or "write".
            topic: the MQTT topic (``+oversized`` is ignored).
        """
        if access == "read":
            return self.authenticator.can_read(self.user, topic)
        return self.authenticator.can_write(self.user, topic)

    def require(self, access: Access, topic: str) -> None:
        """Raise unless the ACL allows: 401 with a challenge for anonymous callers (they may
        hold credentials they did not send), 403 for authenticated ones.

        Args:
            access: "read" or "write".
            topic: the MQTT topic.

        Raises:
            HTTPException: 401 or 403.
        """
        if self.allowed(access, topic):
            return
        if self.user is None and self.authenticator.enabled:
            raise _refusal(self.authenticator.challenge(f"anonymous may not {access} {topic}"))
        raise HTTPException(403, f"not allowed to {access} this topic", dict(self.response_headers))


def authenticated(get_authenticator: Callable[..., Any]) -> Callable[..., Awaitable[Principal]]:
    """A dependency that authenticates the request or raises 401/429.

    Args:
        get_authenticator: a FastAPI dependency returning the :class:`Authenticator`
            (e.g. one that reads it from the app's lifespan state).
    """

    async def dependency(
        request: Request,
        response: Response,
        authenticator: Annotated[Authenticator, Depends(get_authenticator)],
    ) -> Principal:
        client = request.client.host if request.client is not None else ""
        result = authenticator.authenticate(request.headers.get("authorization"), client=client)
        if isinstance(result, Challenge):
            raise _refusal(result)
        _remember(request, response, result)
        return Principal(
            result.user, authenticator, dict(result.response_headers), result.mechanism
        )

    return dependency


def topic_access(
    get_authenticator: Callable[..., Any], access: Access, *, param: str = "topic"
) -> Callable[..., Awaitable[Principal]]:
    """A dependency that authenticates and then checks the ACL for the path's topic.

    Args:
        get_authenticator: as for :func:`authenticated`.
        access: "read" or "write".
        param: the path parameter holding the topic (``+oversized`` is ignored).
    """
    authenticate = authenticated(get_authenticator)

    async def dependency(
        request: Request, principal: Annotated[Principal, Depends(authenticate)]
    ) -> Principal:
        topic = request.path_params.get(param)
        if not isinstance(topic, str):
            raise HTTPException(404, "no topic in the path", dict(principal.response_headers))
        principal.require(access, topic)
        return principal

    return dependency


def _remember(request: Request, response: Response, result: Authenticated) -> None:
    for name, value in result.response_headers.items():
        response.headers[name] = value
    setattr(request.state, STATE_KEY, dict(result.response_headers))


class AuthenticationInfoMiddleware:
    """Adds the authentication's response headers to answers that lack them (errors)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        # One dict shared with the request, which may be a copy of this scope.
        state: dict[str, Any] = scope.setdefault("state", {})

        async def send_with_headers(message: Message) -> None:
            extra = state.get(STATE_KEY)
            if message["type"] == "http.response.start" and extra:
                headers = list(message.get("headers", []))
                present = {name.lower() for name, _ in headers}
                for name, value in extra.items():
                    if name.lower().encode("latin-1") not in present:
                        headers.append((name.encode("latin-1"), value.encode("latin-1")))
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, send_with_headers)
