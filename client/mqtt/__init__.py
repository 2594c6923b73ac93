"""The MQTT adapter: the one module that owns a paho client, and its parts."""
