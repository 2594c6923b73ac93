"""The paho seam, public for other adapters built on paho (the gateway's broker connection).

The client's paho adapter (:mod:`client._paho`) owns the mapping between the project's
:class:`client.protocol.PublishProperties` and paho's `Properties`; anything else that hands
properties to paho takes this one conversion rather than writing its own. A paho type appears
here on purpose: this module is the edge, the rest of the public API never shows one.
"""

from ._paho import to_paho_properties

__all__ = ["to_paho_properties"]
