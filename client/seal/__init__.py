"""End-to-end encryption and compression of payloads (age, zstd): seal and unseal.

Public: `_seal` (a payload as it is stored, for the publish path) and `_unseal` (stored bytes
back to a payload, for the receive path, the CLI and Spark). The codecs themselves are pure
code in `client.protocol` (`_age`, `_zstd`, `_encoding`).
"""
