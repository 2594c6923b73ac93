"""Direct uploads: the payload goes to the object store, the gateway only signs and commits.

Used when the discovery record advertises a `DirectStore` (see gateway/direct/_transfers.py for the
protocol and what each side verifies):

1. hash each part (the grant binds every part's SHA-256 into its presigned URL) and the
   payload (the placeholder's SHA-256), in one read of it;
2. `POST {endpoint}/direct/grant/{topic}` with credentials: one presigned PUT URL per part;
3. PUT the parts to the store in parallel, `concurrency` at a time, each read from the
   :class:`PayloadSource` only when its turn comes (memory: about `concurrency` parts),
   WITHOUT credentials, and only to the advertised store origin;
4. `POST {endpoint}/direct/commit` with the grant and the parts' ETags.

A gateway without direct transfers answers the grant with 404, 405 or 501:
:class:`DirectUnsupported`, and the caller uses the proxied upload instead.
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import threading
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import httpx

from ..core._exceptions import UploadError
from ..core._source import PayloadSource
from ..protocol import MessageId, http_origin, loads_object
from ..protocol._tracecontext import TraceContext
from ._answers import _detail
from ._scram import ScramFailure
from ._transport import UploadReceipt
from ._upload_forms import topic_path

MIN_PART = 5 * 1024 * 1024  # S3's smallest part but the last
MAX_PARTS = 10_000
PART_SIZE = 8 * 1024 * 1024
#: Largest grant or commit answer read (10,000 presigned URLs fit).
MAX_ANSWER_BYTES = 16 * 1024 * 1024
#: Statuses that mean "this gateway has no direct transfers": use the proxied upload.
UNSUPPORTED = frozenset({404, 405, 501})


class DirectUnsupported(UploadError):
    """The gateway does not offer direct transfers (an older one, or switched off)."""


class StoreUnreachable(DirectUnsupported):
    """The advertised store did not answer this client (a network that only lets it reach
    the gateway, a wrong `OFFLOAD_S3_PUBLIC_URL`): the proxied upload may still work."""


def part_size_for(size: int, preferred: int = PART_SIZE) -> int:
    """`preferred`, grown (in MiB steps) until the payload fits S3's 10,000 parts."""
    part = max(preferred, MIN_PART)
    if math.ceil(size / part) > MAX_PARTS:
        mib = 1024 * 1024
        part = math.ceil(size / MAX_PARTS / mib) * mib
    return part


def _spans(size: int, part: int) -> list[tuple[int, int]]:
    if size == 0:
        return [(0, 0)]
    return [(offset, min(part, size - offset)) for offset in range(0, size, part)]


@dataclass(frozen=True)
class PartDigests:
    """A payload's SHA-256 and its direct parts': `part` bytes each (the last shorter)."""

    sha256: str
    part: int
    parts: tuple[str, ...]


class DirectUploader:
    """Uploads payloads straight to the store through a gateway's grants.

    Args:
        client: the pooled httpx client (shared with the transport).
        concurrency: parts in flight at once (and parts held in memory).
        part_size: preferred part size (>= 5 MiB; grown for payloads over 10,000 parts).
    """

    def __init__(
        self, client: httpx.Client, *, concurrency: int = 4, part_size: int = PART_SIZE
    ) -> None:
        self._client = client
        self._concurrency = max(1, concurrency)
        self._part_size = part_size

    def upload(
        self,
        endpoint: str,
        store: str,
        topic: str,
        source: PayloadSource,
        *,
        message_id: MessageId,
        headers: Sequence[tuple[str, str]] = (),
        auth: httpx.Auth | None = None,
        ttl: int | None = None,
        trace: TraceContext | None = None,
        digests: PartDigests | None = None,
    ) -> UploadReceipt:
        """Grant, parallel part PUTs, commit; the stored message's receipt.

        Args:
            endpoint: the gateway base URL (receives credentials).
            store: the store origin the discovery record advertised (receives none).
            topic: the message's topic.
            source: the payload.
            message_id: the id to store it under.
            headers: (name, value) headers stored beside the payload.
            auth: credentials for the gateway.
            ttl: seconds to keep the payload; None: the gateway's default.
            trace: the upload's trace context: `traceparent` / `tracestate` headers on
                the grant and the commit (the gateway's requests), never on the parts
                (the store's).
            digests: the payload's and its parts' SHA-256s when :meth:`digest` took them
                already (a dedup's link question needs the payload's first): the payload
                is not read again for them.

        Raises:
            DirectUnsupported: the gateway has no direct transfers (fall back).
            UploadError: any other refusal or failure; nothing was published.
        """
        base = endpoint.rstrip("/")
        traced = dict(trace.pairs()) if trace is not None else {}
        part = part_size_for(source.size, self._part_size)
        spans = _spans(source.size, part)
        with ThreadPoolExecutor(self._concurrency, thread_name_prefix="offload-direct") as pool:
            reader = _Reader(source)
            if digests is None or digests.part != part:
                digests = self._digest(reader, spans, part, pool)
            sha256 = digests.sha256
            request = _grant_request(
                source.size, sha256, part, list(digests.parts), message_id, ttl
            )
            grant = self._post(
                f"{base}/direct/grant/{topic_path(topic)}",
                request,
                auth,
                grant=True,
                headers=traced,
            )
            urls = _urls(grant, len(spans), store, base)
            try:
                jobs = zip(urls, spans, strict=True)
                etags = list(pool.map(lambda job: self._put(reader, *job), jobs))
            except BaseException:
                pool.shutdown(cancel_futures=True)  # no more parts after the first failure
                self._abandon(base, grant["grant"], auth, traced)
                raise
        self._commit(base, grant["grant"], etags, headers, auth, traced)
        return UploadReceipt(message_id, f"{base}/msg/{message_id}", source.size, sha256)

    def digest(self, source: PayloadSource) -> PartDigests:
        """The payload's SHA-256 and its parts' as :meth:`upload` cuts them, in one read of
        it (the payload's is left in `source`'s cache too)."""
        part = part_size_for(source.size, self._part_size)
        with ThreadPoolExecutor(self._concurrency, thread_name_prefix="offload-direct") as pool:
            return self._digest(_Reader(source), _spans(source.size, part), part, pool)

    def _digest(
        self,
        reader: _Reader,
        spans: Sequence[tuple[int, int]],
        part: int,
        pool: ThreadPoolExecutor,
    ) -> PartDigests:
        sha256, hashes = reader.hashes(spans, pool, self._concurrency)
        return PartDigests(sha256, part, tuple(hashes))

    def _commit(
        self,
        base: str,
        grant: str,
        etags: list[str],
        headers: Sequence[tuple[str, str]],
        auth: httpx.Auth | None,
        traced: dict[str, str],
    ) -> None:
        """Commit the stored parts; abandon the grant when the commit fails."""
        body = {"grant": grant, "etags": etags, "headers": [list(h) for h in headers]}
        try:
            self._post(f"{base}/direct/commit", body, auth, grant=False, headers=traced)
        except UploadError as exc:
            if isinstance(exc.__cause__, httpx.TimeoutException):
                # A gateway that did not answer within the timeout is not asked again (a
                # second timeout): its parts stay until the bucket's lifecycle rule.
                raise
            # The parts stay in the store until aborted. Safe even when the commit went
            # through and only its answer was lost: a grant has one commit or abandon, and
            # an abandon after the commit answers the committed message (gateway side).
            if self._abandon(base, grant, auth, traced) is None:
                raise

    def _post(
        self,
        url: str,
        body: dict[str, Any],
        auth: httpx.Auth | None,
        *,
        grant: bool,
        headers: dict[str, str],
    ) -> dict[str, Any]:
        """POST JSON to the gateway; its 201 JSON answer, read up to MAX_ANSWER_BYTES."""
        # Read raw and bounded: no content coding may inflate it.
        request = self._client.build_request(
            "POST", url, json=body, headers={"Accept-Encoding": "identity", **headers}
        )
        try:
            response = self._client.send(
                request, stream=True, auth=auth or httpx.USE_CLIENT_DEFAULT
            )
            try:
                if grant and response.status_code in UNSUPPORTED:
                    raise DirectUnsupported(url, _detail(response), response.status_code)
                if response.status_code != 201:
                    raise UploadError(url, _detail(response), response.status_code)
                raw = _read_bounded(response, url)
            finally:
                response.close()
        except (httpx.HTTPError, httpx.StreamError) as exc:
            raise UploadError(url, f"direct upload failed: {exc!r}") from exc
        except ScramFailure as exc:
            raise UploadError(url, str(exc), 401) from exc
        try:
            return loads_object(raw, max_bytes=MAX_ANSWER_BYTES)
        except ValueError as exc:
            raise UploadError(url, f"unreadable answer: {exc}") from exc

    def _abandon(
        self, base: str, token: str, auth: httpx.Auth | None, traced: dict[str, str]
    ) -> dict[str, Any] | None:
        """Best effort: the gateway removes what was uploaded (an older gateway drops the
        parts of a multipart upload committed without ETags).

        Returns the commit's answer when the grant had been committed after all (a commit
        whose answer was lost), else None.
        """
        # Abandoned (200), refused or unreachable: then the sweeper or lifecycle rule remains.
        with contextlib.suppress(UploadError):
            body = {"grant": token, "etags": [], "abandon": True}
            return self._post(f"{base}/direct/commit", body, auth, grant=False, headers=traced)
        return None

    def _put(self, reader: _Reader, url: str, span: tuple[int, int]) -> str:
        """PUT one part to the store, no credentials, no cookies; its ETag."""
        data = reader.read(*span)
        request = self._client.build_request(
            "PUT", url, content=data, headers={"Content-Type": "application/octet-stream"}
        )
        request.headers.pop("Cookie", None)
        try:
            response = self._client.send(request, stream=True)  # the body is never wanted
            try:
                if response.status_code != 200:
                    raise UploadError(_redacted(url), _detail(response), response.status_code)
                return str(response.headers.get("ETag", ""))
            finally:
                response.close()
        except httpx.TransportError as exc:
            raise StoreUnreachable(_redacted(url), f"part upload failed: {exc!r}") from exc
        except (httpx.HTTPError, httpx.StreamError) as exc:
            raise UploadError(_redacted(url), f"part upload failed: {exc!r}") from exc


def _read_bounded(response: httpx.Response, url: str) -> bytes:
    """The body, refused once it passes MAX_ANSWER_BYTES (never read further)."""
    body = bytearray()
    for piece in response.iter_raw():
        body += piece
        if len(body) > MAX_ANSWER_BYTES:
            raise UploadError(url, f"answer larger than {MAX_ANSWER_BYTES} bytes: refused")
    return bytes(body)


class _Reader:
    """Serialised reads of a PayloadSource (a file source seeks; PUTs run in parallel)."""

    def __init__(self, source: PayloadSource) -> None:
        self._source = source
        self._lock = threading.Lock()

    def read(self, offset: int, length: int) -> bytes:
        with self._lock:
            return self._source.read_at(offset, length)

    def hashes(
        self,
        spans: Sequence[tuple[int, int]],
        pool: ThreadPoolExecutor,
        held: int,
    ) -> tuple[str, list[str]]:
        """The payload's SHA-256 and each part's, from one read of the payload.

        Each part is read once: hashed on the pool while the payload's digest takes it on
        this thread (hashlib lets go of the GIL: two cores busy), at most `held` parts read
        and not yet hashed. The payload's SHA-256 is left in the source's cache (its own
        one-pass hash would read the file unlocked, racing the part reads) for the
        placeholder built after the upload; one the caller had hashed is not read again.
        A second read for the whole digest made a publish's progress bar show a third pass
        over the file (`publish 3/3`).
        """
        source = self._source
        whole = hashlib.sha256() if source._sha256 is None else None
        parts: list[Future[str]] = []
        for offset, length in spans:
            data = self.read(offset, length)
            parts.append(pool.submit(_sha256, data))
            if whole is not None:
                whole.update(data)
            if len(parts) > held:
                parts[-held - 1].result()  # the memory of `held` parts, never the payload's
        if whole is not None:
            source._sha256 = whole.hexdigest()
        assert source._sha256 is not None
        return source._sha256, [part.result() for part in parts]


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _urls(grant: dict[str, Any], count: int, store: str, endpoint: str) -> list[str]:
    """The grant's part URLs, each checked to lead to the advertised store (hostile input)."""
    urls = grant.get("urls")
    if not isinstance(grant.get("grant"), str):
        raise UploadError(endpoint, "grant answer without a `grant` token")
    if not isinstance(urls, list) or len(urls) != count:
        raise UploadError(endpoint, f"grant answer must list {count} part URLs")
    expected = http_origin(store)
    for url in urls:
        try:
            origin = http_origin(url)
        except ValueError as exc:
            raise UploadError(endpoint, f"grant answer has a bad part URL: {exc}") from exc
        if origin != expected:
            raise UploadError(endpoint, f"part URL leads to {origin}, not the store {expected}")
    return urls


def _redacted(url: str) -> str:
    """A presigned URL without its signature, for error messages and logs."""
    return url.split("?", 1)[0]


def _grant_request(
    size: int,
    sha256: str,
    part_size: int,
    parts: list[str],
    message_id: MessageId,
    ttl: int | None,
) -> dict[str, Any]:
    """The body of `POST /direct/grant/{topic}`."""
    request: dict[str, Any] = {
        "size": size,
        "sha256": sha256,
        "part_size": part_size,
        "parts": parts,
        "id": str(message_id),
    }
    if ttl:
        request["ttl"] = ttl
    return request
