"""rackctl: the operator CLI; the one place that joins daemons and simulators (demo, lock-step)."""
