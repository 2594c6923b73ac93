"""An offloaded payload's upload: linked to the account's stored copy when it has one
(`dedup`), else sent straight to the store when the discovery record advertises one, else
through the gateway; a transient failure retried once with the same message id.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import httpx

from ..core._exceptions import UploadError
from ..core._source import PayloadSource
from ..core._tracing import DISABLED, Span, Tracing
from ..http._direct import DirectUnsupported, DirectUploader, PartDigests
from ..http._retention import link_payload
from ..http._transport import HttpTransport, UploadReceipt
from ..protocol import MessageId, http_origin
from ..protocol._tracecontext import TraceContext
from ..seal._seal import SealedStream
from . import _spans
from ._send import Send

log = logging.getLogger("client")

UPLOAD_ATTEMPTS = 2  # per offloaded publish, same message id each time


def endpoint_host(endpoint: str) -> str:
    """The host of an endpoint URL (`server.address`), "" when it has none."""
    try:
        return http_origin(endpoint).host
    except ValueError:
        return ""


class PayloadUploader:
    """Puts a publish's payload where its placeholder will point (:meth:`upload`).

    Args:
        transport: the HTTP transport to the gateway.
        http_auth: credentials for the endpoint in force.
        direct_store: the store origin the discovery record advertises for direct
            transfers (:mod:`client.http._direct`), None when it advertises none.
        dedup: ask for a linkable payload by SHA-256 and size before sending it.
        tracing: where the upload spans come from (:mod:`client.publish._spans`).
    """

    def __init__(
        self,
        *,
        transport: HttpTransport,
        http_auth: httpx.Auth | None,
        direct_store: Callable[[], str | None],
        dedup: bool,
        tracing: Tracing = DISABLED,
    ) -> None:
        self._transport = transport
        self._http_auth = http_auth
        self._direct_store = direct_store
        self._direct = DirectUploader(transport.client)
        self._dedup = dedup
        self._tracing = tracing

    def upload(
        self,
        endpoint: str,
        send: Send,
        source: PayloadSource | SealedStream,
        message_id: MessageId,
        *,
        linkable: bool = False,
    ) -> str:
        """Upload the payload; the URL it is stored at. Retries a transient failure once.

        A :class:`SealedStream` (sealed while sent) goes through the gateway only: a direct
        transfer hashes every part before it starts. A `linkable` payload (not encrypted:
        an age file differs every time) is first asked for by SHA-256 and size (`dedup`):
        when the account stores it already, no byte of it is sent.
        """
        props = send.properties
        headers = [(k, v.encode()) for k, v in (props.user_properties if props else ())]
        attempt = 0
        digests: PartDigests | None = None
        while True:
            span = _spans.start_upload(
                self._tracing,
                send.span,
                topic=send.topic,
                size=source.size,
                message_id=str(message_id),
                server=endpoint_host(endpoint),
            )
            try:
                with span:
                    if linkable and isinstance(source, PayloadSource) and self._dedup:
                        # The link question needs the payload's SHA-256: a direct upload
                        # after it takes its parts' in that same read of the payload.
                        if digests is None and self._direct_store() is not None:
                            digests = self._direct.digest(source)
                        linked = self._link(endpoint, send, source, message_id, headers, span)
                        if linked is not None:
                            return linked
                    return self._upload_once(
                        endpoint, send, source, message_id, headers, span, digests
                    )
            except UploadError as exc:
                # A dropped connection or a 5xx may have stored the payload or not: the
                # same id again is safe (the gateway answers an identical re-upload with
                # success and keeps one object), so retry before giving up. Not a timeout:
                # a gateway that did not answer within http_timeout would cost it twice.
                timed_out = isinstance(exc.__cause__, httpx.TimeoutException | TimeoutError)
                transient = (exc.status is None and not timed_out) or (exc.status or 0) >= 500
                attempt += 1
                if not transient or attempt >= UPLOAD_ATTEMPTS:
                    raise
                log.info(
                    "upload attempt %d failed (%s); retrying with id %s", attempt, exc, message_id
                )
                time.sleep(0.2 * attempt)

    def _link(
        self,
        endpoint: str,
        send: Send,
        source: PayloadSource,
        message_id: MessageId,
        headers: list[tuple[str, bytes]],
        span: Span,
    ) -> str | None:
        """The message linked to the account's stored copy of the payload; None: upload."""
        props = send.properties
        url = link_payload(
            self._transport.client,
            endpoint,
            send.topic,
            sha256=source.sha256,
            size=source.size,
            message_id=message_id,
            headers=headers,
            auth=self._http_auth,
            ttl=props.message_expiry_interval if props else None,
            trace=span.context,
        )
        if url is not None and span.recording:
            span.set("offload.linked", True)
        return url

    def _upload_once(
        self,
        endpoint: str,
        send: Send,
        source: PayloadSource | SealedStream,
        message_id: MessageId,
        headers: list[tuple[str, bytes]],
        span: Span,
        digests: PartDigests | None = None,
    ) -> str:
        """One upload attempt: direct when the store is advertised, else through the
        gateway; its span's context goes with every request to the gateway."""
        props = send.properties
        try:
            if isinstance(source, PayloadSource):
                receipt = self._direct_upload(
                    endpoint, send, source, message_id, span.context, digests
                )
                if receipt is not None:
                    return receipt.url
            return self._transport.upload(
                endpoint,
                send.topic,
                source,
                message_id=message_id,
                headers=headers,
                auth=self._http_auth,
                # The payload need not outlive the placeholder that points at it.
                ttl=props.message_expiry_interval if props else None,
                trace=span.context,
            ).url
        except UploadError as exc:
            if exc.status is not None and span.recording:
                span.set("http.response.status_code", exc.status)
            raise

    def _direct_upload(
        self,
        endpoint: str,
        send: Send,
        source: PayloadSource,
        message_id: MessageId,
        trace: TraceContext | None,
        digests: PartDigests | None,
    ) -> UploadReceipt | None:
        """Upload straight to the store when the endpoint advertises it; None: use the proxy."""
        store = self._direct_store()
        if store is None:
            return None
        props = send.properties
        try:
            return self._direct.upload(
                endpoint,
                store,
                send.topic,
                source,
                message_id=message_id,
                headers=props.user_properties if props else (),
                auth=self._http_auth,
                ttl=props.message_expiry_interval if props else None,
                trace=trace,
                digests=digests,
            )
        except DirectUnsupported as exc:  # an older gateway, or a store out of reach
            log.info("direct upload unavailable (%s); uploading through the gateway", exc)
            return None
