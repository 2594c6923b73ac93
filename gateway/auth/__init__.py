"""HTTP authentication and authorization from the broker's own users and rules.

One identity for broker and offload API: the gateway reads mosquitto's ``password_file``
(SCRAM-SHA-512 per RFC 7804, Basic and Bearer over TLS) and ``acl_file`` (the same
read/write rules the broker applies), or the dynamic security plugin's file (users, groups,
roles), and re-reads them when they change; it verifies JWT bearer tokens (EMQX's ``acl``
claim, or the rules in force) with keys from a JWKS file or URL or an HS256 secret. The HTTP
adapter is ``gateway.http._authz`` (the gateway's own), so that this package imports without
FastAPI.
"""

from ._acl import Acl, AclRule, base_topic, filter_matches, parse_acl
from ._authenticator import Authenticator
from ._claim_acl import ClaimAcl, parse_claim_acl
from ._decisions import CLOSED_DETAIL, Authenticated, AuthMode, Challenge
from ._dynsec import DynamicSecurity, Event
from ._dynsec_parse import parse_dynsec
from ._exceptions import AuthConfigError, AuthError
from ._files import WAIT_SECONDS as RELOAD_WAIT
from ._files import WatchedFile
from ._jwks import KeySet, key_sources, parse_jwks
from ._jwt import JwtIdentity, JwtRefused, JwtVerifier, looks_like_jwt
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
    "RELOAD_WAIT",
    "SCRAM_MIN_ITERATIONS",
    "Acl",
    "AclRule",
    "AuthConfigError",
    "AuthError",
    "AuthMode",
    "Authenticated",
    "Authenticator",
    "Challenge",
    "ClaimAcl",
    "DynamicSecurity",
    "Event",
    "JwtIdentity",
    "JwtRefused",
    "JwtVerifier",
    "KeySet",
    "PasswordEntry",
    "PasswordFile",
    "ScramKeys",
    "WatchedFile",
    "base_topic",
    "filter_matches",
    "key_sources",
    "looks_like_jwt",
    "parse_acl",
    "parse_claim_acl",
    "parse_dynsec",
    "parse_jwks",
    "parse_password_file",
    "parse_tokens_file",
    "token_digest",
]
