"""Direct transfers: clients send and fetch payload bytes at the store, the gateway signs.

`_transfers` (`Direct`) issues upload grants, parses their commit requests and signs
download redirects. The routes are `gateway.http._routes_direct` (grants) and
`gateway.http._direct_commit` (commit); the store's side is `gateway.storage` (`DirectStore`,
`storage/_s3_direct.py`).

Other folders use only the names below.
"""

from ._transfers import (
    GRANTS_PREFIX,
    MAX_REQUEST_BYTES,
    CommitRequest,
    Direct,
    Grant,
    GrantRequest,
    b64_of_hex,
    claim_expiry,
    parse_commit_request,
    parse_grant_request,
)

__all__ = [
    "GRANTS_PREFIX",
    "MAX_REQUEST_BYTES",
    "CommitRequest",
    "Direct",
    "Grant",
    "GrantRequest",
    "b64_of_hex",
    "claim_expiry",
    "parse_commit_request",
    "parse_grant_request",
]
