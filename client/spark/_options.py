"""Options of the `offload` data source, parsed and checked once on the driver. Pure, no I/O."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from urllib.parse import parse_qs, unquote, urlsplit

from ..core._exceptions import ConfigError
from ..protocol import TopicFilter
from ._offsets import positive_ms

# The gateway's OFFLOAD_DIRECT_GRANT_TTL default: a direct upload's key (and so its hour
# partition) is chosen at its grant, up to this long before the commit that stamps it.
DEFAULT_GRANT_TTL_MS = 3_600_000

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


class Verify(enum.Enum):
    """What the `verify` option checks of each payload against its manifest.

    The reader holds the store's credentials and trusts it: whoever can rewrite a payload
    there can rewrite its manifest too, so no checksum kept beside the payload can stand
    against them. What verification catches is corruption (a bad disk, a truncated copy, a
    restore gone wrong) and a payload that does not belong to its manifest (a torn or
    mismatched object). CRC-32C does that, as S3's own `x-amz-checksum-crc32c` does, at
    a fifth of SHA-256's CPU or less; SHA-256 additionally makes a deliberate collision
    infeasible, which matters only where manifests are kept apart from payloads.
    """

    OFF = "false"  # check nothing (not even the size)
    AUTO = "true"  # size, and the manifest's CRC-32C; SHA-256 when it records none
    SHA256 = "sha256"  # size and SHA-256, whatever else the manifest records


class OnBadObject(enum.Enum):
    """What a scan does with one object it cannot turn into a row (see `_bad`)."""

    SKIP = "skip"  # skip it, log it by key, count it (the default)
    FAIL = "fail"  # fail the task, naming the object


@dataclass(frozen=True, slots=True)
class StorageLocation:
    """Where the objects are: one S3 bucket, or the embedded store's directory.

    Secrets live here too; they are left out of the repr so a log line never shows them.
    """

    scheme: str  # "s3" or "file"
    bucket: str  # the bucket, or the store's absolute directory for "file"
    endpoint: str = ""  # HOST:PORT for "s3"
    secure: bool = True
    region: str | None = None
    access_key: str | None = field(default=None, repr=False)
    secret_key: str | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.scheme not in ("s3", "file"):
            raise ConfigError(f"unsupported storage scheme {self.scheme!r}")
        if not self.bucket:
            raise ConfigError("storage URL names no bucket or directory")
        if self.scheme == "s3" and not self.endpoint:
            raise ConfigError("s3 storage URL needs HOST:PORT")

    @property
    def url(self) -> str:
        """The location as a URL without credentials, for messages."""
        if self.scheme == "file":
            return f"file://{self.bucket}"
        return f"s3://{self.endpoint}/{self.bucket}"


def parse_storage_url(
    url: str, *, access_key: str | None = None, secret_key: str | None = None
) -> StorageLocation:
    """Parse `s3://HOST:PORT/BUCKET?secure=false&region=R` or `file:///PATH`.

    Args:
        url: the storage URL, as the gateway takes it.
        access_key: S3 access key (None: anonymous).
        secret_key: S3 secret key.
    """
    parts = urlsplit(url)
    if parts.scheme == "file":
        path = unquote(parts.path)
        if parts.netloc not in ("", "localhost") or not path.startswith("/"):
            raise ConfigError(f"file storage URL must be file:///ABSOLUTE/PATH, got {url!r}")
        return StorageLocation("file", path.rstrip("/") or "/")
    if parts.scheme != "s3":
        raise ConfigError(f"storage URL must start with s3:// or file://, got {url!r}")
    bucket = parts.path.strip("/")
    if "/" in bucket:
        raise ConfigError(f"storage URL must be s3://HOST:PORT/BUCKET, got {url!r}")
    query = parse_qs(parts.query)
    secure = _flag(query.get("secure", ["true"])[0], "secure")
    return StorageLocation(
        "s3",
        bucket,
        endpoint=parts.netloc,
        secure=secure,
        region=query.get("region", [None])[0],
        access_key=access_key,
        secret_key=secret_key,
    )


def parse_time(text: str, name: str = "time") -> int:
    """Milliseconds since the epoch from epoch milliseconds or ISO-8601 text.

    Text without a zone is UTC, like every date in the storage layout.

    Args:
        text: `1732233600000`, `2026-11-22`, `2026-11-22T10:00`, `2026-11-22T10:00:00+01:00`.
        name: the option's name, for the error message.
    """
    text = text.strip()
    if text.lstrip("-").isdigit():
        return int(text)
    try:
        parsed = datetime.fromisoformat(text)
    except ValueError as exc:
        raise ConfigError(f"{name}: expected ISO-8601 or epoch milliseconds, got {text!r}") from exc
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return int(parsed.timestamp() * 1000)


def _flag(value: str, name: str) -> bool:
    lowered = value.strip().lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise ConfigError(f"{name}: expected true or false, got {value!r}")


def _verify(value: str) -> Verify:
    lowered = value.strip().lower()
    if lowered in ("sha256", "sha-256"):
        return Verify.SHA256
    if lowered in _TRUE:
        return Verify.AUTO
    if lowered in _FALSE:
        return Verify.OFF
    raise ConfigError(f"verify: expected true, sha256 or false, got {value!r}")


def _on_bad_object(value: str) -> OnBadObject:
    lowered = value.strip().lower()
    for choice in OnBadObject:
        if lowered == choice.value:
            return choice
    raise ConfigError(f"onBadObject: expected skip or fail, got {value!r}")


def _positive(value: str, name: str) -> int:
    try:
        number = int(value)
    except ValueError as exc:
        raise ConfigError(f"{name}: expected a positive integer, got {value!r}") from exc
    if number < 1:
        raise ConfigError(f"{name}: expected a positive integer, got {value!r}")
    return number


@dataclass(frozen=True, slots=True)
class ScanOptions:
    """A checked `spark.read.format("offload")` request."""

    location: StorageLocation
    topic_filter: TopicFilter = field(default_factory=lambda: TopicFilter("#"))
    since: int | None = None  # ms, inclusive
    until: int | None = None  # ms, exclusive
    payload: bool = True
    verify: Verify = Verify.AUTO
    parallelism: int | None = None  # None: what `register` saw, else the CPU count
    on_bad_object: OnBadObject = OnBadObject.SKIP
    grant_ttl: int = DEFAULT_GRANT_TTL_MS  # ms a key may precede its stamp (direct uploads)
    #: age identity files (paths on the executors) for encrypted payloads; `decode` off
    #: returns the stored bytes (age files, zstd frames) as they are (docs/encryption.md).
    identity_files: tuple[str, ...] = ()
    decode: bool = True

    def __post_init__(self) -> None:
        if self.since is not None and self.until is not None and self.since >= self.until:
            raise ConfigError(f"since ({self.since}) must be before until ({self.until})")

    def listing_since(self, since: int | None) -> int | None:
        """Where to start listing for messages stamped from `since` on.

        A direct upload is keyed (its `date=`/`hour=` partition) at its grant and stamped at
        its commit, up to `grant_ttl` later, so the listing reaches that far back; the
        manifests' exact stamps then decide.
        """
        return None if since is None else since - self.grant_ttl

    def selects_time(self, timestamp_ms: int) -> bool:
        """Whether a message stamped `timestamp_ms` lies in [since, until)."""
        if self.since is not None and timestamp_ms < self.since:
            return False
        return self.until is None or timestamp_ms < self.until


def parse_options(
    options: Mapping[str, str], *, defaults: Mapping[str, str] | None = None
) -> ScanOptions:
    """Check the data source's options.

    Credentials come from the `accessKey`/`secretKey` options, else from `defaults` (what
    `register` read from the driver's environment: this function reads no environment).

    Args:
        options: Spark's case-insensitive option map (keys are compared lower-cased).
        defaults: fallbacks for missing options (credentials, parallelism).
    """
    opts = {k.lower(): v for k, v in (defaults or {}).items()}
    opts.update({k.lower(): v for k, v in options.items() if v is not None})
    url = opts.get("storage") or opts.get("path")
    if not url:
        raise ConfigError('the offload data source needs option("storage", URL)')
    access = opts.get("accesskey") or opts.get("access_key")
    secret = opts.get("secretkey") or opts.get("secret_key")
    location = parse_storage_url(url, access_key=access, secret_key=secret)
    topic = opts.get("topic")
    try:
        topic_filter = TopicFilter(topic) if topic else TopicFilter("#")
    except ValueError as exc:
        raise ConfigError(f"topic: {exc}") from exc
    since = opts.get("since")
    until = opts.get("until")
    parallelism = opts.get("parallelism")
    return ScanOptions(
        location=location,
        topic_filter=topic_filter,
        since=parse_time(since, "since") if since else None,
        until=parse_time(until, "until") if until else None,
        payload=_flag(opts.get("payload", "true"), "payload"),
        verify=_verify(opts.get("verify", "true")),
        parallelism=_positive(parallelism, "parallelism") if parallelism else None,
        on_bad_object=_on_bad_object(opts.get("onbadobject", "skip")),
        grant_ttl=positive_ms(opts["grantttl"], "grantTtl")
        if "grantttl" in opts
        else DEFAULT_GRANT_TTL_MS,
        identity_files=tuple(
            p.strip() for p in opts.get("identity_files", "").split(",") if p.strip()
        ),
        decode=_flag(opts.get("decode", "true"), "decode"),
    )
