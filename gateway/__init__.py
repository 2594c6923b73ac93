"""mqtt-offload gateway: the HTTP offload API in front of S3-compatible storage."""
