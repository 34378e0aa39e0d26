"""MQTT-ST (seed 001): Mosquitto brokers joined by a spanning tree built over MQTT."""
