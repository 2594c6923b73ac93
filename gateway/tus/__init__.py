"""Resumable uploads (tus 1.0): protocol, locks, stored state (see __init__)."""
