"""The publish path: route a message (direct, offloaded, chunked), send it, wait for acks.

Public (for `client.Client`): `_publish` (the publisher), `_will` (the Will message,
offloaded when too large) and `_send` (a publish's fixed parts; `wait_ack`, the wait for a
PUBACK or SUBACK). Internal: `_router` (which way a message goes; pure), `_spans` (its
spans and the trace context a message carries), `_uploader` (an offloaded payload's upload:
linked, direct or through the gateway, retried once), `_chunked` (the ADR-23 chunks of
one message) and `_window` (the QoS 0 PUBLISHes not yet written). Seals payloads with
`client.seal`, uploads with `client.http`, sends with `client.mqtt`.
"""
