"""tray-agent: the node agent of compute trays (node-agent contract v1 on MQTT): reads the GPUs
(NVML) and the links (sysfs), publishes ``telemetry/trayNN``, applies racky's
``set_power_limits`` as per-GPU power limits and reports what is enforced (docs/TRAY-AGENT.md)."""
