"""The offload service: payloads into the store and back out (see __init__)."""
