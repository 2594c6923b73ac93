"""Discovery of the offload endpoint over a retained MQTT topic."""
