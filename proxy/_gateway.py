"""The proxy's HTTP side: the library's raw upload (`PUT /msg/<id>?topic=`) fed from the
client's socket while it arrives, and the payload fetch for placeholders it resolves.

One pooled `httpx.AsyncClient` for the whole proxy. Credentials are the client's own
(:func:`credentials`): the gateway checks them against the broker's password file and the
topic against its ACL, so nothing is stored under a topic the client could not publish to.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import ssl
import urllib.request
from collections.abc import AsyncIterator, Callable
from urllib.parse import quote

import httpx

from client import ScramAuth
from client.protocol import DiscoveryRecord, MessageId, Origin, Placeholder, http_origin

from ._exceptions import TransferFailed
from ._http11 import H11Transport
from .protocol import Connect, Stored

RAW_CONTENT_TYPE = "application/octet-stream"
MAX_ERROR_BODY = 4096
#: Largest `GET /` record read from the gateway (a real one is under 1 KiB).
MAX_RECORD_BYTES = 16384
REDIRECTS = frozenset({301, 302, 303, 307, 308})


def credentials(connect: Connect) -> httpx.Auth | None:
    """SCRAM with the CONNECT's user name and password; None without both (anonymous, or a
    certificate login: the gateway then serves only if it allows anonymous uploads)."""
    if connect.username is None or connect.password is None:
        return None
    try:
        password = connect.password.decode("utf-8")
    except UnicodeDecodeError:
        return None
    return ScramAuth(connect.username, password)


async def _bounded_to(response: httpx.Response, limit: int) -> bytes:
    """At most `limit` bytes of an answer's body."""
    body = b""
    async for piece in response.aiter_raw():
        body += piece
        if len(body) >= limit:
            break
    return body[:limit]


async def _bounded(response: httpx.Response) -> bytes:
    """At most MAX_ERROR_BODY bytes of an answer's body (the gateway's JSON is far less)."""
    return await _bounded_to(response, MAX_ERROR_BODY)


async def _detail(response: httpx.Response) -> str:
    text = (await _bounded(response)).decode("utf-8", "replace")
    return f"HTTP {response.status_code}: {text[:200]}"


async def _pieces(response: httpx.Response, url: str) -> AsyncIterator[bytes]:
    try:
        async for piece in response.aiter_raw():
            yield piece
    except httpx.HTTPError as exc:
        raise TransferFailed(f"fetch of {url} broke off: {type(exc).__name__}") from exc


#: Bytes hashed per hop to a worker thread (hashlib releases the GIL): the event loop serves
#: other connections while a large message is hashed, and one hop per MiB (not per 64 KiB
#: piece) keeps the hand-over cheap.
HASH_BATCH = 1 << 20


class Hasher:
    """SHA-256 of a stream, taken in batches on a worker thread (at most one batch held)."""

    def __init__(self) -> None:
        self._digest = hashlib.sha256()
        self._pending: list[bytes] = []
        self._pending_bytes = 0

    def _update(self, pieces: list[bytes]) -> None:
        for piece in pieces:
            self._digest.update(piece)

    async def add(self, piece: bytes) -> None:
        self._pending.append(piece)
        self._pending_bytes += len(piece)
        if self._pending_bytes >= HASH_BATCH:
            await self._flush()

    async def _flush(self) -> None:
        pieces, self._pending, self._pending_bytes = self._pending, [], 0
        if sum(len(p) for p in pieces) >= 65536:
            await asyncio.to_thread(self._update, pieces)
        else:
            self._update(pieces)

    async def hexdigest(self) -> str:
        await self._flush()
        return self._digest.hexdigest()


def http_client(timeout: float, verify: ssl.SSLContext | bool) -> httpx.AsyncClient:
    """The gateway link's client: over :class:`H11Transport`, unless a proxy is configured
    (httpx honours `HTTP(S)_PROXY`/`ALL_PROXY`/`NO_PROXY` only with its own transport)."""
    if urllib.request.getproxies():
        return httpx.AsyncClient(timeout=timeout, verify=verify)
    return httpx.AsyncClient(timeout=timeout, transport=H11Transport(verify=verify))


class GatewayLink:
    """Uploads and fetches against the gateway.

    Args:
        timeout: seconds for connect and for each read or write.
    """

    def __init__(self, *, timeout: float, verify: ssl.SSLContext | bool = True) -> None:
        self._http = http_client(timeout, verify)
        # Per gateway origin: the store origin its `GET /` declares (None: it declares none).
        self._stores: dict[Origin, Origin | None] = {}

    async def _declared_store(self, gateway: Origin) -> Origin | None:
        """The `DirectStore` of the gateway's own record (`GET /`), read once and kept.

        A payload redirect is followed only there: a placeholder names the gateway, and the
        gateway alone says where its store is (as the library does, client/http/_store_origin.py).
        """
        if gateway in self._stores:
            return self._stores[gateway]
        store: Origin | None = None
        try:
            async with self._http.stream("GET", f"{gateway}/") as response:
                body = await _bounded_to(response, MAX_RECORD_BYTES + 1)
            if response.status_code == 200 and len(body) <= MAX_RECORD_BYTES:
                record = DiscoveryRecord.from_json(body)
                if record.direct_store is not None:
                    store = http_origin(record.direct_store)
        except (httpx.HTTPError, ValueError):  # MalformedDiscoveryRecord is a ValueError
            return None  # asked again next time
        self._stores[gateway] = store
        return store

    async def aclose(self) -> None:
        await self._http.aclose()

    async def upload(
        self,
        endpoint: str,
        *,
        topic: str,
        size: int,
        pieces: AsyncIterator[bytes],
        headers: tuple[tuple[str, str], ...],
        ttl: int | None,
        auth: httpx.Auth | None,
        on_bytes: Callable[[int], None] = lambda n: None,
    ) -> Stored:
        """Stream `size` bytes from `pieces` to a new message id; what the gateway stored.

        The SHA-256 is taken while the bytes pass and must equal the one the gateway
        answers (it takes its CRC-32C in the same pass).

        Raises:
            TransferFailed: no answer, a refusal, or a stored payload that is not the bytes
                sent. An error from `pieces` (the client went silent or away) propagates
                and the gateway, cut off mid-body, keeps nothing.
        """
        message_id = MessageId.new()
        digest = Hasher()
        sent = 0

        async def body() -> AsyncIterator[bytes]:
            nonlocal sent
            async for piece in pieces:
                await digest.add(piece)
                sent += len(piece)
                on_bytes(len(piece))
                yield piece

        url = f"{endpoint}/msg/{message_id}"
        params: dict[str, str | int] = {"topic": topic}
        if ttl:
            params["ttl"] = ttl
        fields = [f"{quote(k, safe='')}={quote(v, safe='')}" for k, v in headers]
        request_headers = [
            ("Content-Type", RAW_CONTENT_TYPE),
            ("Content-Length", str(size)),
            *(("X-Offload-Header", field) for field in fields),
        ]
        try:
            request = self._http.build_request(
                "PUT", url, params=params, headers=request_headers, content=body()
            )
            response = await self._http.send(
                request, auth=auth or httpx.USE_CLIENT_DEFAULT, stream=True
            )
            try:
                if response.status_code != 201:
                    raise TransferFailed(await _detail(response), response.status_code)
                answer = json.loads(await _bounded(response))
            finally:
                await response.aclose()
        except httpx.HTTPError as exc:
            raise TransferFailed(f"upload to {url} failed: {type(exc).__name__}") from exc
        except ValueError as exc:  # JSONDecodeError, or a body that is not UTF-8
            raise TransferFailed(f"upload to {url}: the answer is not JSON") from exc
        sha256 = await digest.hexdigest()
        if not isinstance(answer, dict) or sent != size or answer.get("sha256") != sha256:
            raise TransferFailed(f"the gateway stored other bytes than were sent to {url}")
        if answer.get("size") != size:
            raise TransferFailed(f"the gateway stored other bytes than were sent to {url}")
        return Stored(f"{endpoint}/msg/{message_id}", size, sha256, message_id)

    @contextlib.asynccontextmanager
    async def fetch(
        self, ref: Placeholder, auth: httpx.Auth | None
    ) -> AsyncIterator[AsyncIterator[bytes]]:
        """The payload's bytes as they arrive, once the answer is 200 with the declared size.

        Raises:
            TransferFailed: another answer, another length, no answer.
        """
        url = ref.payload_url
        request = self._http.build_request("GET", url, headers={"Accept-Encoding": "identity"})
        try:
            response = await self._http.send(
                request, auth=auth or httpx.USE_CLIENT_DEFAULT, stream=True
            )
        except httpx.HTTPError as exc:
            raise TransferFailed(f"fetch of {url} failed: {type(exc).__name__}") from exc
        try:
            location = response.headers.get("location")
            if response.status_code in REDIRECTS and location is not None:
                # Direct transfers: the gateway sends the bytes' presigned store URL. Followed
                # once, without credentials, and only to the store the gateway declares.
                target = response.url.join(location)
                await response.aclose()
                response = await self._redirected(url, str(target))
            if response.status_code != 200:
                raise TransferFailed(await _detail(response), response.status_code)
            if response.headers.get("content-length") != str(ref.size):
                raise TransferFailed(f"{url} does not declare the placeholder's size")
            if response.headers.get("content-encoding", "identity") != "identity":
                raise TransferFailed(f"{url} answers with a content coding")
            yield _pieces(response, url)
        finally:
            await response.aclose()

    async def _redirected(self, url: str, target: str) -> httpx.Response:
        """The store's answer for a payload redirect, if it leads to the declared store."""
        try:
            origin = http_origin(target)
        except ValueError as exc:
            raise TransferFailed(f"fetch of {url}: redirect refused: {exc}") from exc
        if origin != await self._declared_store(http_origin(url)):
            raise TransferFailed(f"fetch of {url}: redirect to {origin} refused: not its store")
        request = self._http.build_request("GET", target, headers={"Accept-Encoding": "identity"})
        request.headers.pop("Cookie", None)
        try:
            return await self._http.send(request, auth=None, stream=True)
        except httpx.HTTPError as exc:
            raise TransferFailed(f"fetch of {target} failed: {type(exc).__name__}") from exc
