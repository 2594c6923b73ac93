"""`offload fetch` and `offload upload`: the commands that talk HTTP to the gateway only.

Both log in the same way as :class:`client.Client` (a bearer token, else SCRAM with the broker
login: `username`/`password` from the settings layers over the broker URL's) and both find
the gateway the same way (:func:`client.commands._args.gateway_endpoint`). Imports are made when a
command runs: `offload --help` loads no HTTP library (tests/test_cli_startup.py).
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import hashlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, cast

from ..core._exceptions import FetchError, UploadError
from ._args import settings_from_args
from ._errors import EXIT_OK, describe, refused
from ._output import BinaryStdout, emit, message_line, write_bytes

if TYPE_CHECKING:
    import httpx

    from ..config._settings import ClientSettings
    from ..core._tracing import Span, Tracing
    from ..http._transport import HttpTransport
    from ..http._upload import Sealing, UploadResult
    from ..protocol import Placeholder
    from ..protocol._tracecontext import TraceContext

__all__ = ["fetch_command", "upload_command"]


def fetch_command(args: argparse.Namespace) -> int:
    """`offload fetch URL|ID`: the payload to `-o FILE` (and a message line) or stdout.

    Every request goes through one :class:`client.http._transport.HttpTransport`, as the
    library's fetches do: `ca_file` and the client certificate, the login sent to the URL
    named (as `curl -u`) and never where it redirects.
    """
    from ..http._transport import HttpTransport

    if args.output is not None and args.output.is_dir():
        # Before any download: a directory cannot become the file.
        raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(args.output))
    settings = settings_from_args(args)
    auth = _gateway_login(settings)
    ref: Placeholder | None = args.placeholder  # validated: parsed from --placeholder FILE
    if args.url is not None:  # validated: a URL, or a message id made into one
        shown: str = args.url.rstrip("/")
    else:  # validated: then there is a placeholder
        assert ref is not None
        shown = ref.url
    url, message_id = _payload_url(shown)
    if message_id is None and ref is not None:
        message_id = str(ref.message_id)
    verify = settings.tls_files.http_verify()
    with (
        HttpTransport(timeout=settings.http_timeout, verify=verify) as transport,
        _fetch_span(args.tracing, url, message_id) as span,
    ):
        trace = span.context
        if args.range is not None:  # client/commands/_range.py: only the chunks the range needs
            data, read = _fetch_range(transport, url, args, settings, auth, trace)
            extra: dict[str, object] = {"stored_bytes_read": read}
            size, sha256 = len(data), hashlib.sha256(data).hexdigest()
        elif ref is not None:
            size, sha256 = _fetch_placeholder(transport, url, ref, args, settings, auth, trace)
            extra = {}
        else:
            size, sha256 = _fetch_streamed(transport, url, args, settings, auth, trace)
            extra = {}
    if args.output is not None:
        emit(
            message_line(
                topic=None,
                message_id=message_id,
                size=size,
                sha256=sha256,
                route="offloaded",
                url=shown,
                file=str(args.output),
                **extra,
            )
        )
    return EXIT_OK


def _payload_url(url: str) -> tuple[str, str | None]:
    """The URL of the raw bytes `url` names, and its message id when it names one.

    `{endpoint}/msg/<id>` is the BSON document: its `/payload` is fetched instead.
    """
    from ..protocol import MessageId

    levels = url.split("/")
    raw = levels[-1] == "payload"  # {endpoint}/msg/<id>/payload
    try:
        message_id: str | None = str(MessageId.parse(levels[-2 if raw else -1]))
    except ValueError:
        message_id = None
    if message_id is not None and not raw and levels[-2] == "msg":
        url += "/payload"  # the raw bytes, not the BSON document
    return url, message_id


def _fetch_span(tracing: Tracing, url: str, message_id: str | None) -> Span:
    """`fetch`: a CLIENT span, a child of the caller's trace (`TRACEPARENT`)."""
    from ..protocol import http_origin

    attributes: dict[str, str | int] = {"messaging.system": "mqtt"}
    attributes["messaging.operation.name"] = "fetch"
    if message_id is not None:
        attributes["messaging.message.id"] = message_id
    with contextlib.suppress(ValueError):
        attributes["server.address"] = http_origin(url).host
    return tracing.start("fetch", "client", use_ambient=True, attributes=attributes)


def _fetch_range(
    transport: HttpTransport,
    url: str,
    args: argparse.Namespace,
    settings: ClientSettings,
    auth: httpx.Auth | None,
    trace: TraceContext | None,
) -> tuple[bytes, int]:
    """`--range`: those bytes written, and how many stored bytes were read for them."""
    from ..config._keys import load_identities
    from ..http._range import RangeReader
    from ._range import fetch_range

    start, end = args.range
    identities = [] if args.raw else load_identities(settings.identity_files)
    reader = RangeReader(transport.reader, url, None, auth=auth, redirect_ok=_anywhere, trace=trace)
    data, read = fetch_range(reader, start, end, identities, raw=args.raw, url=url)
    if args.output is not None:
        with _replacing(args.output) as out:
            out.write(data)
    else:
        write_bytes(data)
    return data, read


def _fetch_placeholder(
    transport: HttpTransport,
    url: str,
    ref: Placeholder,
    args: argparse.Namespace,
    settings: ClientSettings,
    auth: httpx.Auth | None,
    trace: TraceContext | None,
) -> tuple[int, str]:
    """`--placeholder`: the stored bytes checked against its size and SHA-256 as they come
    (the library's own fetch, :func:`client.receive._fetcher.fetch_payload`), decoded as its
    `enc` and `cmp` say; written only once every check passed."""
    from ..receive._fetcher import fetch_payload
    from ..seal._unseal import Unsealer
    from ._progress import Progress

    unsealer = None if args.raw else Unsealer(settings)  # a bad identity file: an error now
    with Progress(ref.size, label="fetch") as bar:
        payload, sha256 = fetch_payload(
            transport,
            ref,
            settings=settings,
            unsealer=unsealer,
            auth=auth,
            redirect_ok=_anywhere,
            url=url,
            on_bytes=lambda done, _: bar.update(done - bar.done),
            trace=trace,
        )
    try:
        _check_sha256(url, args.sha256, stored=ref.sha256, written=sha256)
        if args.output is not None:
            payload.save(args.output)
        else:
            with payload.open() as f:
                while piece := f.read(1 << 20):
                    write_bytes(piece)
    finally:
        payload.discard()
    return payload.size, sha256


def _fetch_streamed(
    transport: HttpTransport,
    url: str,
    args: argparse.Namespace,
    settings: ClientSettings,
    auth: httpx.Auth | None,
    trace: TraceContext | None,
) -> tuple[int, str]:
    """The bytes written as they arrive, decoded unless `--raw`, with a progress bar on a
    terminal; their size and SHA-256 (the stored bytes' only with `--raw`). `-o FILE`
    gets a temporary file renamed over it at the end; with `--sha256`, stdout gets nothing
    until the bytes matched (spooled meanwhile)."""
    from ._crypt import decoding_writer
    from ._progress import CountingWriter, Progress

    stored, plain = hashlib.sha256(), hashlib.sha256()
    # The bar goes to stderr, so `offload fetch URL > file` on a terminal shows it too.
    total = _content_length(transport, url, auth)
    with (
        Progress(total, label="fetch") as bar,
        _destination(args.output, args.sha256 is not None, settings.spool_dir) as target,
    ):
        written = _Digesting(target, plain)
        with decoding_writer(args, settings, cast(BinaryIO, written)) as out:
            sink = cast(BinaryIO, CountingWriter(out, bar, stored))
            transport.fetch_to(url, sink, auth=auth, redirect_ok=_anywhere, trace=trace)
        _check_sha256(url, args.sha256, stored=stored.hexdigest(), written=plain.hexdigest())
    return written.size, plain.hexdigest()


def _check_sha256(url: str, expected: str | None, *, stored: str, written: str) -> None:
    """`--sha256` (None: not given) is the payload's or the stored bytes' SHA-256.

    Raises:
        PayloadChecksumMismatch: it is neither.
    """
    if expected is not None and expected not in (stored, written):
        from ..core._exceptions import PayloadChecksumMismatch

        raise PayloadChecksumMismatch(url, expected, written)


class _Digesting:
    """A binary file that hashes and counts what is written through it."""

    def __init__(self, raw: BinaryIO, digest: Any) -> None:
        self._raw = raw
        self._digest = digest
        self.size = 0

    def write(self, data: bytes) -> int:
        self._digest.update(data)
        self.size += len(data)
        return self._raw.write(data)

    def flush(self) -> None:
        self._raw.flush()


@contextlib.contextmanager
def _destination(output: Path | None, hold: bool, spool_dir: str | None) -> Iterator[BinaryIO]:
    """Where a streamed fetch writes: `output`, through a temporary file renamed over it
    when the block ends without an error; else stdout, which with `hold` gets the bytes
    only then (spooled meanwhile)."""
    if output is not None:
        with _replacing(output) as out:
            yield out
    elif not hold:
        yield cast(BinaryIO, BinaryStdout())
    else:
        import tempfile

        with tempfile.TemporaryFile(dir=spool_dir) as spool:
            yield cast(BinaryIO, spool)
            spool.seek(0)
            while piece := spool.read(1 << 20):
                write_bytes(piece)


def _sealing(settings: ClientSettings, topic: str) -> Sealing | None:
    """How `offload upload` encrypts a file for `topic`; None when it is not encrypted.

    The file is sealed as `offload publish` seals it (:class:`client.seal._seal.Sealer`,
    compression included when `compress_encrypted`) into the spool file the uploader names,
    written under a temporary name and renamed, so a spool file is always whole.
    """
    from ..config._keys import recipients_for
    from ..core._source import PayloadSource
    from ..http._upload import Sealing
    from ..seal._seal import SealedStream, Sealer

    sealer = Sealer(settings)
    if not sealer.encrypts(topic):
        return None
    recipients = recipients_for(settings.encrypt_to, topic)

    def write(file: Path, into: Path) -> dict[str, str]:
        part = into.with_name(into.name + ".part")
        try:
            with PayloadSource(file) as source, sealer.seal(topic, source, stream=True) as stored:
                assert isinstance(stored.source, SealedStream)  # stream, recipients: sealed
                with part.open("wb") as out:
                    for piece in stored.source.pieces():
                        out.write(piece)
                members = stored.encoding.members()
            os.replace(part, into)
        except BaseException:
            part.unlink(missing_ok=True)  # a full disk or ^C: no half spool left behind
            raise
        kid = members.pop("kid", [])
        return {
            **{k: str(v) for k, v in members.items()},
            **({"kid": ",".join(kid)} if kid else {}),
        }

    ident = ",".join(sorted(r.key_id for r in recipients))
    return Sealing(f"{ident};compress_encrypted={settings.compress_encrypted}", write)


def _gateway_login(settings: ClientSettings) -> httpx.Auth | None:
    """The login every command presents to the gateway, as :class:`client.Client` does: a
    bearer token (its own, or a broker password that is a JWT), else the broker login
    (`--username`/`--password` over the broker URL's); `http_login` picks by name."""
    from ..http._scram import gateway_auth

    login = settings.broker_url
    return gateway_auth(
        username=login.username,
        password=login.password,
        token=settings.http_token,
        scheme=settings.http_login,
    )


def _anywhere(origin: object) -> bool:
    """`offload fetch URL` follows redirects like `curl -L` (a gateway with direct transfers
    redirects to its store): the user named the URL, and credentials never follow a redirect."""
    return True


@contextlib.contextmanager
def _replacing(path: Path) -> Iterator[BinaryIO]:
    """Write to a temporary file beside `path`, renamed over it only on success.

    A failed download leaves no empty or truncated file and never clobbers an earlier one.
    """
    import tempfile

    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".part", dir=path.parent)
    except OSError as exc:  # name the user's file, not the hidden temporary one
        raise OSError(exc.errno, exc.strerror, str(path)) from None
    try:
        with os.fdopen(fd, "wb") as out:
            yield out
        os.replace(tmp, path)
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        raise OSError(exc.errno, exc.strerror, str(path)) from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _content_length(transport: HttpTransport, url: str, auth: httpx.Auth | None) -> int | None:
    """The payload's size for the progress bar's ETA; None when the server does not say."""
    if not sys.stderr.isatty():
        return None
    import httpx

    from ..http._scram import ScramFailure

    try:
        answer = transport.reader.head(url, auth=auth or httpx.USE_CLIENT_DEFAULT)
        length = answer.headers.get("content-length")
    except httpx.TimeoutException as exc:  # the fetch would only wait as long again
        raise FetchError(url, f"fetch failed: {exc!r}") from exc
    except (httpx.HTTPError, ScramFailure):  # the fetch itself will say what is wrong
        return None
    return int(length) if length and length.isdigit() else None


def upload_command(args: argparse.Namespace) -> int:
    """`offload upload`: a resumable (tus) upload that the gateway publishes."""
    import httpx

    from ..core._tracing import message_attributes
    from ..http._upload import TusUploader, spool_path, state_path
    from ._progress import Progress

    settings = settings_from_args(args)
    sealing = _sealing(settings, args.topic)  # an encrypt_to topic: sealed, then uploaded
    auth = _gateway_login(settings)
    size = args.file.stat().st_size
    bar = Progress(size, label="upload")

    def started(offset: int) -> None:
        if sealing is not None:  # the sealed bytes are what goes up
            bar.total = spool_path(remembered()).stat().st_size
        bar.restart_from(offset)
        if offset and args.resume is None:  # resumed by default: say so, and how not to
            print(
                f"offload: continuing the unfinished upload of {args.file} from byte {offset} "
                "(--no-resume starts over)",
                file=sys.stderr,
            )

    verify = settings.tls_files.http_verify()
    attributes = message_attributes(args.topic, size, "upload", "send")
    span = args.tracing.start(
        f"upload {args.topic}", "client", use_ambient=True, attributes=attributes
    )
    traced = dict(span.context.pairs()) if span.context is not None else None
    with (
        span,
        httpx.Client(
            auth=auth, timeout=settings.http_timeout, verify=verify, headers=traced
        ) as http,
        bar,
    ):
        uploader = TusUploader(
            http, args.endpoint, state_dir=args.state_dir, segment=args.segment_size
        )

        def remembered() -> Path:
            return state_path(uploader.state_dir, args.file, uploader.endpoint, args.topic, sealing)

        try:
            result = uploader.upload(
                args.file,
                args.topic,
                resume=args.resume is not False,
                content_type=args.content_type,
                on_bytes=bar.update,
                on_start=started,
                sealing=sealing,
            )
        except (UploadError, KeyboardInterrupt) as exc:
            if not remembered().exists() or refused(exc):  # nothing to resume, or a login to fix
                raise
            bar.close()
            code, line = describe(exc)
            # Resuming is the default: say so, unless this very command said --no-resume.
            again = "without --no-resume " if args.resume is False else ""
            print(f"{line}; the same command {again}continues it", file=sys.stderr)
            return code
    _uploaded_line(args, result)
    return EXIT_OK


def _uploaded_line(args: argparse.Namespace, result: UploadResult) -> None:
    """The message line of a finished upload."""
    extra = {"content_type": args.content_type} if args.content_type else {}
    emit(
        message_line(
            topic=args.topic,
            message_id=result.message_id,
            size=result.size,
            sha256=result.sha256,
            route="offloaded",
            url=result.url,
            resumed_from=result.resumed_from,
            **extra,
        )
    )
