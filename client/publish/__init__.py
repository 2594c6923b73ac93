"""The publish path: route a message (direct, offloaded, chunked), send it, wait for acks.

Public (for `client.Client`): `_publish` (the publisher) and `_will` (the Will message,
offloaded when too large). Internal: `_router` (which way a message goes; pure), `_spans`
(its spans and the trace context a message carries). Seals
payloads with `client.seal`, uploads with `client.http`, sends with `client.mqtt`.
"""
