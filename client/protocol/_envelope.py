"""Sans-I/O streaming BSON codec for hop-client's offload documents.

Two documents cross the offload API (reference 002, "Large Message Support"):

* upload (``POST /topic/<t>+oversized``): ``{message: binary, headers: [[str, binary], ...]
  or {str: binary}, key?: binary}``;
* download (``GET /msg/<id>``): ``{message: binary, metadata: {timestamp: int64 ms,
  headers: [[str, binary], ...], key?: binary, topic: str}}``.

Payloads can be as large as BSON allows (a document is at most 2**31 - 1 bytes, its length
being an int32), so neither side ever holds the payload: the encoders return the bytes that
go before and after it, and :class:`EnvelopeParser` hands the payload back as zero-copy
slices of the buffers it is fed while it buffers and decodes only the small other fields.

Decisions the format leaves open:

* Field order does not matter. Our encoders put every other field before ``message`` so a
  reader learns headers and metadata before the payload; hop-client puts ``message`` first.
* ``message`` must be a binary element of subtype 0 (generic) or 2 (the deprecated "old
  binary", whose redundant inner length is checked and stripped); any other type or subtype
  is rejected. The same rule holds for binaries inside the other fields.
* Duplicate keys are rejected at every level: readers that keep the first and readers that
  keep the last value would otherwise disagree on what was sent. Array keys must be the
  indices "0", "1", ... as the BSON spec requires.
* Supported element types in the buffered fields: double, string, document, array, binary,
  bool, UTC datetime, null, int32, uint64 (0x11, as hop.bson writes it), int64. Anything else
  (ObjectId, regex, code, decimal128, min/max key, ...) is an error naming the type.
* Nesting deeper than :data:`MAX_DEPTH` is rejected, so no input can exhaust the stack.
* Upload header values and key may be BSON strings as well as binaries, because hop-client's
  ``Producer.write`` documents "string-like" header values and its BSON encoder writes a
  ``str`` as a string; they are returned as their UTF-8 bytes. Download documents must use
  binaries, as hop-client's ``_check_bson_message_structure`` requires.
* A download without a key omits ``metadata.key`` (hop-client reads ``.get("key", None)``);
  a missing or null key reads back as None.

This module is the stable import surface; the code lives in four small modules:

* :mod:`._bson_values`: decoding of the buffered (non-payload) values, a reader per type;
* :mod:`._envelope_encode`: :func:`encode_upload` and :func:`encode_download`;
* :mod:`._envelope_events`: the events the parser reports;
* :mod:`._envelope_parse`: :class:`EnvelopeParser`, a state machine driven by tables.
"""

from ._bson_values import MAX_BSON_DOCUMENT, MAX_DEPTH
from ._envelope_encode import encode_download, encode_upload
from ._envelope_events import Complete, Event, PayloadData, PayloadEnd, PayloadStart
from ._envelope_parse import EnvelopeParser

__all__ = [
    "MAX_BSON_DOCUMENT",
    "MAX_DEPTH",
    "Complete",
    "EnvelopeParser",
    "Event",
    "PayloadData",
    "PayloadEnd",
    "PayloadStart",
    "encode_download",
    "encode_upload",
]
