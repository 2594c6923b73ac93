"""HTTP authentication and authorization from mosquitto's own password and ACL files.

One identity for broker and offload API: the gateway reads mosquitto's ``password_file``
(SCRAM-SHA-512 per RFC 7804, Basic and Bearer over TLS) and ``acl_file`` (the same
read/write rules the broker applies) and re-reads them when they change. The HTTP
adapter is ``gateway.http._authz`` (the gateway's own), so that this package imports without
FastAPI.
"""

from ._acl import Acl, AclRule, base_topic, filter_matches, parse_acl
from ._authenticator import Authenticator
from ._decisions import CLOSED_DETAIL, Authenticated, AuthMode, Challenge
from ._exceptions import AuthConfigError, AuthError
from ._passwd import (
    SCRAM_MIN_ITERATIONS,
    PasswordEntry,
    PasswordFile,
    ScramKeys,
    parse_password_file,
)
from ._tokens import parse_tokens_file, token_digest

__all__ = [
    "CLOSED_DETAIL",
    "SCRAM_MIN_ITERATIONS",
    "Acl",
    "AclRule",
    "AuthConfigError",
    "AuthError",
    "AuthMode",
    "Authenticated",
    "Authenticator",
    "Challenge",
    "PasswordEntry",
    "PasswordFile",
    "ScramKeys",
    "base_topic",
    "filter_matches",
    "parse_acl",
    "parse_password_file",
    "parse_tokens_file",
    "token_digest",
]
