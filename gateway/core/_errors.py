"""The gateway's errors and their one mapping to HTTP responses.

Hierarchy::

    GatewayError                .status, .reason
    +-- BadRequest              400  (also raised for client.ProtocolError)
    +-- Unauthorized            401  (.headers carries the challenge)
    +-- Forbidden               403
    +-- NotFound                404
    +-- Conflict                409
    +-- PayloadTooLarge         413
    +-- Gone                    410  a resumable upload expired or was terminated
    +-- PreconditionFailed      412  another tus protocol version
    +-- UnsupportedMediaType    415
    +-- RangeNotSatisfiable     416
    +-- TooManyRequests         429  failed logins or concurrent uploads rate-limited
    +-- ChecksumMismatch        460  tus: a segment does not hash to its Upload-Checksum
    +-- StorageUnavailable      503  the object store failed or is unreachable
    +-- BrokerUnavailable       503  the MQTT broker is unreachable

Client mistakes never surface as 5xx: protocol errors from `client.protocol` become 400, and
every 5xx means the gateway or a server behind it failed.
"""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError

from client.protocol import EnvelopeTooLarge, ProtocolError

from ..storage import StoreError
from ._json import JSONAnswer
from ._observability import BROKER_ERRORS, STORAGE_ERRORS

log = logging.getLogger("gateway")


class GatewayError(Exception):
    status = 500

    def __init__(self, reason: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.headers = headers or {}


class BadRequest(GatewayError):
    status = 400


class Unauthorized(GatewayError):
    status = 401


class Forbidden(GatewayError):
    status = 403


class NotFound(GatewayError):
    status = 404


class Conflict(GatewayError):
    status = 409


class PayloadTooLarge(GatewayError):
    status = 413


class RangeNotSatisfiable(GatewayError):
    status = 416


class ChecksumMismatch(GatewayError):
    """tus 460: a segment (or the whole payload) does not hash to what the client said."""

    status = 460


class Gone(GatewayError):
    """The upload expired or was terminated."""

    status = 410


class UnsupportedMediaType(GatewayError):
    status = 415


class PreconditionFailed(GatewayError):
    """tus 412: the client speaks another protocol version."""

    status = 412


class TooManyRequests(GatewayError):
    status = 429


class StorageUnavailable(GatewayError):
    status = 503


class BrokerUnavailable(GatewayError):
    status = 503


# Statuses any route can answer through the shared error mapping and middleware; each
# route's `responses` adds its own on top, so the OpenAPI document names every status.
COMMON_RESPONSES: dict[int | str, dict[str, str]] = {
    400: {"description": "malformed request (reason in `detail`)"},
    401: {"description": "authentication required (`WWW-Authenticate` names the schemes)"},
    403: {"description": "authenticated but not allowed for this topic"},
    404: {"description": "unknown, expired or gone"},
    408: {"description": "the request body stalled (no bytes within the idle timeout)"},
    413: {"description": "body larger than the configured maximum"},
    429: {"description": "too many failed logins or concurrent uploads (`Retry-After`)"},
    503: {"description": "object store or broker unavailable (reason in `detail`)"},
}


def _json(status: int, reason: str, headers: dict[str, str] | None = None) -> JSONAnswer:
    return JSONAnswer({"detail": reason}, status_code=status, headers=headers)


def install_error_handlers(app: FastAPI) -> None:
    """Map every error to a response in one place."""

    async def gateway_error(request: Request, exc: Exception) -> JSONAnswer:
        assert isinstance(exc, GatewayError)
        if isinstance(exc, StorageUnavailable):
            STORAGE_ERRORS.inc()
        elif isinstance(exc, BrokerUnavailable):
            BROKER_ERRORS.inc()
        if exc.status >= 500:
            log.warning("%s %s -> %d: %s", request.method, request.url.path, exc.status, exc)
        return _json(exc.status, exc.reason, exc.headers)

    async def protocol_error(request: Request, exc: Exception) -> JSONAnswer:
        status = 413 if isinstance(exc, EnvelopeTooLarge) else 400
        return _json(status, str(exc))

    async def validation_error(request: Request, exc: Exception) -> JSONAnswer:
        assert isinstance(exc, RequestValidationError)
        parts = [
            f"{'.'.join(str(p) for p in err.get('loc', ()))}: {err.get('msg')}"
            for err in exc.errors()
        ]
        return _json(400, "; ".join(parts) or "invalid request")

    async def store_error(request: Request, exc: Exception) -> JSONAnswer:
        STORAGE_ERRORS.inc()
        log.warning("%s %s -> 503: %s", request.method, request.url.path, exc)
        return _json(503, f"object store unavailable: {exc}")

    app.add_exception_handler(GatewayError, gateway_error)
    app.add_exception_handler(StoreError, store_error)
    app.add_exception_handler(ProtocolError, protocol_error)
    app.add_exception_handler(RequestValidationError, validation_error)
