"""The `offload` CLI's parts; its entry point is `client.cli`."""
