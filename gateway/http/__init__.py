"""The offload API: every route, and the request context and dependencies they share.

Routes: `_routes` (the hop-client API and payload reads), `_routes_raw` (`PUT /msg/{id}`),
`_routes_publish` (`/publish/{topic}`), `_routes_tus` (tus uploads, on `gateway.tus`),
`_routes_direct` and `_direct_commit` (direct transfers, on `gateway.direct`), `_presign`,
`_routes_info` (`GET /`), `_ops` (health, readiness, metrics). Shared by them: `_context`
(the one services value), `_deps` (one dependency per resource), `_ingest` (receive,
commit, announce: the one sequence), `_receive` (a body into the store), `_announce` (the
placeholder on the broker), `_authz` (`gateway.auth` as HTTP), `_responses`, `_ranges`,
`_signing`.

Top of the layers: only the composition root (`gateway._app`) imports these modules, to wire
their routers and middleware; nothing below imports this folder.
"""
