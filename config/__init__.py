"""Bundled configuration: register maps, example configs, scenarios, broker and Grafana files.

Shipped in the wheel as the package ``rackplane_config`` (see pyproject.toml).
"""
