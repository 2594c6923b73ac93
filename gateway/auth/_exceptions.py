"""Every error the auth package raises.

Hierarchy::

    AuthError
    +-- AuthConfigError (also ValueError)   .path, .line: a password, ACL or tokens file
                                            that cannot be used as a whole (mosquitto would
                                            refuse to start with it too)

Failed authentication is not an exception: :meth:`Authenticator.authenticate` answers a
:class:`Challenge` value, so junk from the network never escapes as an error.
"""

from __future__ import annotations

from pathlib import Path


class AuthError(Exception):
    """Base class of the auth package's errors."""


class AuthConfigError(AuthError, ValueError):
    """A credentials or ACL file that cannot be used."""

    def __init__(self, message: str, *, path: Path | None = None, line: int | None = None):
        where = ""
        if path is not None:
            where = f"{path}:{line}: " if line is not None else f"{path}: "
        super().__init__(f"{where}{message}")
        self.path = path
        self.line = line
