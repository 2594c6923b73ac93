"""The MQTT adapter: the one module that owns a paho client (`_paho`), and its parts.

Public: `_paho` (`MqttConnection`, `Incoming`; the gateway uses it as `client.MqttConnection`),
`_broker` (`BrokerUrl`), `_tls` (`TlsFiles`), `_session` and `_websocket` (what the settings
carry), `_acks` (`InvalidPublish`). Internal: `_props` (PUBLISH properties to and from
paho), `_paho_session` (the one reach into paho's session queue). No paho type leaves it.
Exports nothing here: importing `client.mqtt._broker` must not load paho.
"""
