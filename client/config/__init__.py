"""Client settings: `ClientSettings`, declared once, and every source it is read from.

Public: `_settings` (`ClientSettings`; also `client.ClientSettings`; `python -m
client.config._settings` prints the docs/settings.md table), `_load` (`load_settings`, also
`client.load_settings`, and `merge_settings`: the layers a ClientSettings is made of),
`_keys` (the `encrypt_to` forms and identity files, for `client.seal`, the CLI and Spark)
and `_overrides` (`SettingsOverrides`: the settings as keyword arguments, typed for mypy).
Internal: `_file` (the TOML config-file layer), `_parsers` (one parser per setting),
`_allowlist`. Exports nothing here, so that importing a module of it stays light.
"""
