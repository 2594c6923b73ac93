"""mqtt-offload gateway: the HTTP offload API in front of S3-compatible storage."""

from ._app import create_app
from .core import Settings, get_settings

__all__ = ["Settings", "create_app", "get_settings"]
