"""The `offload` CLI's parts; its entry point is `client.cli` (`offload = "client.cli:main"`).

`_args` (the parser and the settings it makes), `_errors` (one line and one exit code per
failure), `_output` (JSON lines on stdout), `_http` (`offload fetch`, `offload upload`),
`_crypt` (`offload keygen`, decrypting fetches), `_range` (`fetch --range`), `_progress`.
Only `client.cli` imports them. Each loads its heavy imports when its command runs, so
`offload --help` stays fast (tests/test_cli_startup.py).
"""
