"""What every path of the client shares: its exceptions, its message types, payload sources.

Public: `_exceptions` (the one exception hierarchy, drawn in its docstring; `client`
re-exports it, and importing it stays light), `_message` (`Message`, `Payload`,
`PublishResult`, `Route`, also exported by `client`), `_source` (what a payload may be given
as, and how it is read once), `_tracing` (the tracing seam: spans, or free no-ops),
`_tracers` (which one a part gets) and `_otel` (the OpenTelemetry adapter: the only module
that imports `opentelemetry`, loaded only by `_tracers`; `client.tracing` exports them).
Imports nothing of the client but `client.protocol`; exports nothing here, so that
importing one module of it stays light.
"""
