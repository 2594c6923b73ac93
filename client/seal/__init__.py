"""End-to-end encryption of payloads (age): seal and unseal."""
