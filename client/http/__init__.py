"""Payload bytes over HTTP, to and from the gateway or the store, and HTTP auth.

Public: `_transport` (`HttpTransport`: streaming upload, verified and spooled fetch; also
`client.HttpTransport`), `_direct` (direct uploads, for the publish path), `_scram` (SCRAM
and bearer auth; `client.ScramAuth`, `client.BearerAuth`), `_store_origin` (which store a
gateway may redirect to), `_range` (a range of an offloaded payload, decrypting only the age
chunks it needs: `Client.fetch_range`, `offload fetch --range`), `_answers` and `_deadline`
(reading answers, pacing a fetch, for the receive path), `_upload` (tus uploads, for
`offload upload`). Internal: `_fetching`, `_upload_forms`, `_urllib3`. Exports nothing
here, so that httpx loads on first use.
"""
