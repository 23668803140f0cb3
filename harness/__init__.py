"""What joins daemons and simulators: lock-step runs, benchmarks, demo wiring, test servers."""
