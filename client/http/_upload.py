"""Resumable file upload to the gateway (tus 1.0), for `offload upload`.

The file goes up in segments (default 8 MiB: at least S3's 5 MiB part minimum, so the
gateway assembles them server-side), each with `Upload-Checksum: sha256`. The upload URL is
remembered in a small state file (`~/.cache/mqtt-offload/uploads/<key>.json`, keyed by the
file's path, size, mtime, endpoint and topic), so `--resume` continues from the offset the
gateway acknowledged last (HEAD) after a dropped connection or a killed process.

A file for an encrypted topic (`encrypt_to`) is sealed first (:class:`Sealing`) into a spool
file beside its state file (`<key>.sealed`, ciphertext only), and those bytes go up, with the
placeholder's `enc`, `kid` and `cmp` in `Upload-Metadata`; the gateway copies them into the
placeholder it publishes. A resumed upload sends the rest of that same spool file, so every
byte of one upload is under one file key; without its spool (deleted, another machine) an
encrypted upload is never resumed: it starts over, sealed afresh, as a new upload. The
recipients are part of the state key, so a change of recipients starts over too.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import httpx

from ..core._exceptions import UploadError
from ._scram import ScramFailure

TUS_VERSION = "1.0.0"
SEGMENT = 8 * 1024 * 1024
_TUS = {"Tus-Resumable": TUS_VERSION}


@dataclass(frozen=True, slots=True)
class Sealing:
    """How a file is encrypted before it is uploaded.

    Attributes:
        ident: names the recipients (and anything else that changes the sealed form); part
            of the state key, so a remembered upload is resumed only under the same ones.
        write: seals the file (first argument) into the path given second and returns the
            `Upload-Metadata` that describes the result (`enc`, `kid`, `cmp`).
    """

    ident: str
    write: Callable[[Path, Path], dict[str, str]]


@dataclass(frozen=True, slots=True)
class UploadResult:
    """A completed resumable upload: the published message."""

    message_id: str
    url: str
    size: int
    sha256: str
    resumed_from: int


def default_state_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "mqtt-offload" / "uploads"


def state_path(
    state_dir: Path, file: Path, endpoint: str, topic: str, sealing: Sealing | None = None
) -> Path:
    """Where the upload URL for this (file version, endpoint, topic, recipients) is remembered."""
    st = file.stat()
    ident = f"{file.resolve()}\0{st.st_size}\0{st.st_mtime_ns}\0{endpoint}\0{topic}"
    if sealing is not None:
        ident += f"\0sealed\0{sealing.ident}"
    return state_dir / (hashlib.sha256(ident.encode()).hexdigest()[:32] + ".json")


def spool_path(state: Path) -> Path:
    """The sealed bytes of the encrypted upload remembered at `state`."""
    return state.with_suffix(".sealed")


def file_sha256(file: Path, on_bytes: Callable[[int], None] | None = None) -> str:
    digest = hashlib.sha256()
    with file.open("rb") as f:
        while piece := f.read(1 << 20):
            digest.update(piece)
            if on_bytes is not None:
                on_bytes(len(piece))
    return digest.hexdigest()


def _remembered(path: Path) -> dict[str, str] | None:
    """The upload URL and SHA-256 remembered at `path`; None when there is none to use.

    A state file cut short (the process killed while writing it) or edited by hand is
    ignored: the upload starts over, as if nothing were remembered.
    """
    try:
        saved = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(saved, dict) or not all(
        isinstance(saved.get(key), str) for key in ("url", "sha256")
    ):
        return None
    return {"url": saved["url"], "sha256": saved["sha256"]}


def _meta(items: dict[str, str]) -> str:
    return ",".join(f"{k} {base64.b64encode(v.encode()).decode()}" for k, v in items.items())


def _detail(response: httpx.Response) -> str:
    try:
        return f"HTTP {response.status_code}: {response.json()['detail']}"
    except (ValueError, KeyError, TypeError):
        return f"HTTP {response.status_code}"


class TusUploader:
    """Upload one file to `{endpoint}/uploads/` and let the gateway publish it.

    Args:
        client: the httpx client (auth, TLS and timeouts are its business).
        endpoint: the gateway base URL.
        state_dir: where upload URLs are remembered for `resume`.
        segment: bytes per PATCH.
    """

    def __init__(
        self,
        client: httpx.Client,
        endpoint: str,
        *,
        state_dir: Path | None = None,
        segment: int = SEGMENT,
    ) -> None:
        if segment <= 0:
            raise ValueError("segment must be positive")
        self.client = client
        self.endpoint = endpoint.rstrip("/")
        self.state_dir = state_dir or default_state_dir()
        self.segment = segment

    def _create(self, body: Path, name: str, topic: str, sha256: str, extra: dict[str, str]) -> str:
        meta = {"topic": topic, "filename": name, "sha256": sha256, **extra}
        url = f"{self.endpoint}/uploads/"
        try:
            r = self.client.post(
                url,
                headers={**_TUS, "Upload-Length": str(body.stat().st_size),
                         "Upload-Metadata": _meta(meta)},
            )  # fmt: skip
        except httpx.HTTPError as exc:
            raise UploadError(url, f"cannot create the upload: {exc!r}") from exc
        except ScramFailure as exc:  # a refused login: the status the CLI reports it by
            raise UploadError(url, str(exc), 401) from exc
        if r.status_code != 201 or "location" not in r.headers:
            raise UploadError(url, _detail(r), r.status_code)
        return str(httpx.URL(url).join(r.headers["location"]))

    def _offset(self, location: str) -> tuple[int, httpx.Headers] | None:
        """The acknowledged offset, None when the gateway no longer knows the upload."""
        try:
            r = self.client.head(location, headers=_TUS)
        except httpx.HTTPError as exc:
            raise UploadError(location, f"cannot ask for the offset: {exc!r}") from exc
        except ScramFailure as exc:
            raise UploadError(location, str(exc), 401) from exc
        if r.status_code in (404, 410):
            return None
        if r.status_code != 200:
            raise UploadError(location, f"HTTP {r.status_code}", r.status_code)
        return int(r.headers["upload-offset"]), r.headers

    def _patch(self, location: str, offset: int, data: bytes) -> httpx.Response:
        checksum = base64.b64encode(hashlib.sha256(data).digest()).decode()
        try:
            r = self.client.patch(
                location,
                content=data,
                headers={**_TUS, "Upload-Offset": str(offset),
                         "Content-Type": "application/offset+octet-stream",
                         "Upload-Checksum": f"sha256 {checksum}"},
            )  # fmt: skip
        except httpx.HTTPError as exc:
            raise UploadError(location, f"segment at {offset} failed: {exc!r}") from exc
        except ScramFailure as exc:
            raise UploadError(location, str(exc), 401) from exc
        if r.status_code != 204:
            raise UploadError(location, _detail(r), r.status_code)
        return r

    def upload(
        self,
        file: Path,
        topic: str,
        *,
        resume: bool = False,
        content_type: str | None = None,
        on_bytes: Callable[[int], None] | None = None,
        on_start: Callable[[int], None] | None = None,
        sealing: Sealing | None = None,
    ) -> UploadResult:
        """Upload `file` for `topic`, resuming a remembered upload when `resume` is set.

        Args:
            file: the file to send.
            topic: the MQTT topic the gateway publishes the placeholder on.
            resume: continue the upload remembered for this file, endpoint and topic.
            content_type: the message's content type.
            on_bytes: called with each number of bytes acknowledged (progress).
            on_start: called once with the offset the upload starts from.
            sealing: encrypt the file first and upload the sealed bytes (see the module).

        Raises:
            UploadError: the gateway refused or could not be reached.
        """
        remembered = state_path(self.state_dir, file, self.endpoint, topic, sealing)
        # What goes up: the file, or its sealed form (the same bytes on every resume).
        body = file if sealing is None else spool_path(remembered)
        found = self._resumed(remembered, body, sealing) if resume else None
        if isinstance(found, UploadResult):
            return found
        if found is None:
            location, size, sha256 = self._created(
                file, body, topic, remembered, content_type, sealing
            )
            offset = 0
        else:
            location, offset, size, sha256 = found
        started = offset
        if on_start is not None:
            on_start(offset)
        with body.open("rb") as f:
            response = self._send(f, location, offset, size, on_bytes)
        remembered.unlink(missing_ok=True)
        if sealing is not None:
            body.unlink(missing_ok=True)
        return UploadResult(
            response.headers["x-offload-id"],
            response.headers["x-offload-url"],
            size,
            sha256,
            started,
        )

    def _resumed(
        self, remembered: Path, body: Path, sealing: Sealing | None
    ) -> tuple[str, int, int, str] | UploadResult | None:
        """Where the upload remembered in `remembered` stands: its URL, offset, size and
        SHA-256; its result when it finished earlier; None when there is none to continue."""
        saved = _remembered(remembered)
        if saved is None or (sealing is not None and not body.is_file()):
            return None  # none, or the ciphertext is gone: never re-encrypt under it
        size = body.stat().st_size
        known = self._offset(saved["url"])
        if known is None or known[1].get("upload-length") != str(size):
            return None  # gone, or another upload's bytes: start over
        offset, headers = known
        sha256 = saved["sha256"]
        if offset == size and "x-offload-url" in headers:  # finished earlier
            remembered.unlink(missing_ok=True)
            if sealing is not None:
                body.unlink(missing_ok=True)
            return UploadResult(
                headers["x-offload-id"], headers["x-offload-url"], size, sha256, offset
            )
        return saved["url"], offset, size, sha256

    def _created(
        self,
        file: Path,
        body: Path,
        topic: str,
        remembered: Path,
        content_type: str | None,
        sealing: Sealing | None,
    ) -> tuple[str, int, str]:
        """A new upload of `body` (sealed from `file` first): its URL, size and SHA-256,
        remembered in `remembered` for a resume."""
        remembered.parent.mkdir(parents=True, exist_ok=True)
        remembered.unlink(missing_ok=True)  # never pair an old upload with a new seal
        extra = {"content_type": content_type} if content_type else {}
        if sealing is not None:
            extra.update(sealing.write(file, body))
        size = body.stat().st_size
        sha256 = file_sha256(body)
        try:
            location = self._create(body, file.name, topic, sha256, extra)
        except BaseException:
            if sealing is not None:
                body.unlink(missing_ok=True)  # nothing remembers it
            raise
        remembered.write_text(json.dumps({"url": location, "sha256": sha256}))
        return location, size, sha256

    def _send(
        self,
        f: BinaryIO,
        location: str,
        offset: int,
        size: int,
        on_bytes: Callable[[int], None] | None,
    ) -> httpx.Response:
        f.seek(offset)
        if offset == size:  # all bytes there, announcement pending: an empty PATCH retries
            return self._patch(location, offset, b"")
        while offset < size:
            data = f.read(min(self.segment, size - offset))
            response = self._patch(location, offset, data)
            offset = int(response.headers["upload-offset"])
            if on_bytes is not None:
                on_bytes(len(data))
        return response
