"""Shared test configuration: the real-server fixtures live in tests/servers.py."""

pytest_plugins = ["tests.servers"]
