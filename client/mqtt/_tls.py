"""TLS for both hops: the CA to trust and the client certificate to show.

One value, :class:`TlsFiles`, made from the settings `ca_file`, `cert_file`, `key_file` and
`key_password`, gives the SSL context for an `mqtts://` / `wss://` broker and for an
`https://` gateway (httpx and the urllib3 reader both take the context). A client
certificate is what brokers that authenticate devices by X.509 ask for (AWS IoT Core, Azure
Event Grid, mosquitto with `require_certificate true`); a gateway behind a proxy that asks
for one gets the same certificate.

The files are read when the context is made, that is when the client is built, so a wrong
path or password is a :class:`ConfigError` naming the file before anything connects.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass, field

from ..core._exceptions import ConfigError

__all__ = ["TlsFiles", "handshake_refusal"]


@dataclass(frozen=True, slots=True)
class TlsFiles:
    """CA bundle and client certificate (PEM files), each optional."""

    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    key_password: str | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.key_file is not None and self.cert_file is None:
            raise ConfigError("key_file needs cert_file (the certificate it is the key of)")

    @property
    def default(self) -> bool:
        """Nothing set: the system's CAs and no client certificate."""
        return self.ca_file is None and self.cert_file is None

    def context(self) -> ssl.SSLContext:
        """A client context: verifies the server against `ca_file` (else the system's CAs)
        and shows the client certificate when one is set.

        Raises:
            ConfigError: a file that cannot be read or used, or a wrong key password.
        """
        try:
            context = ssl.create_default_context(cafile=self.ca_file)
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(f"ca_file {self.ca_file!r} cannot be used: {exc}") from exc
        if self.cert_file is not None:
            try:
                context.load_cert_chain(self.cert_file, self.key_file, self.key_password)
            except (OSError, ssl.SSLError) as exc:
                # OpenSSL's words for a wrong password vary ("bad decrypt", "EVP_DECRYPT"):
                # name the files and the setting instead of guessing which.
                files = self.cert_file + (f" / {self.key_file}" if self.key_file else "")
                hint = "; is key_password right?" if self.key_password is not None else ""
                raise ConfigError(
                    f"client certificate {files} cannot be used: {exc}{hint}"
                ) from exc
        return context

    def http_verify(self) -> bool | ssl.SSLContext:
        """What httpx takes as `verify=`: True (its defaults) when nothing is set."""
        return True if self.default else self.context()


def handshake_refusal(exc: BaseException | str) -> str | None:
    """Why a broker refused the TLS handshake, in words, when `exc` (or a log line) says so.

    Under TLS 1.3 a server checks the client's certificate after the client considers the
    handshake done, so a refusal arrives as an alert on the first read, not at connect.
    """
    text = str(exc).upper()
    if "CERTIFICATE_REQUIRED" in text or "PEER DID NOT RETURN A CERTIFICATE" in text:
        return "the broker requires a client certificate (set cert_file and key_file)"
    if "UNKNOWN_CA" in text or "BAD_CERTIFICATE" in text or "CERTIFICATE_UNKNOWN" in text:
        return "the broker refused the client certificate (not signed by a CA it trusts?)"
    if "CERTIFICATE_VERIFY_FAILED" in text:
        return f"the broker's certificate could not be verified (ca_file?): {exc}"
    return None
