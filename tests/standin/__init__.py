"""Stand-ins built from source in the test run (the stand-in libnvidia-ml.so.1)."""
