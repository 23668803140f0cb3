"""sims: plant models (pure) and their protocol faces (Modbus TCP, MQTT)."""
