"""mqtt-offload client: publish and receive MQTT messages of any size."""
