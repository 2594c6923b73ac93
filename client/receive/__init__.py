"""The receive path: reassemble, fetch, verify, order, acknowledge, deliver.

Public: `_receive` (the receiver and its worker thread, for `client.Client`), `_handout`
(where `client.Client` takes the deliveries: their receive span, the end of iteration),
`_fetcher` (a placeholder's fetch and the origins it may use: whole payloads for the
worker, ranges for `Client.fetch_range`; the plain-http warner the publish path shares)
and `_chunkstore` (`SpoolingChunkStore`, also `client.SpoolingChunkStore`). Internal:
`_inbound` (the bounded hand-off from paho's thread), `_ordering` (per-topic order with
concurrent fetches), `_session_acks` (when a QoS 1/2 message is acknowledged). Unseals
with `client.seal`, fetches with `client.http`.
"""
