"""The MQTT adapter: the one module that owns a paho client (`_paho`), and its parts.

Public: `_paho` (`MqttConnection`, `Incoming`; the gateway uses it as `client.MqttConnection`),
`_broker` (`BrokerUrl`), `_tls` (`TlsFiles`), `_session` and `_websocket` (what the settings
carry), `_acks` (`InvalidPublish`). Internal: `_props` (PUBLISH properties to and from
paho), `_paho_session` (the one reach into paho's session queue), `_paho_setup` (the paho
client's options, CONNECT properties and socket), `_paho_publishes` and
`_paho_subscriptions` (what the connection sends and the futures of their acks). No paho
type leaves it.
Exports nothing here: importing `client.mqtt._broker` must not load paho.
"""
