"""Payload bytes over HTTP: fetch, upload, direct transfers, HTTP auth."""
