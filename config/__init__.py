"""Bundled configuration: register maps, example daemon/sim configs, scenarios, broker and Grafana files.

Shipped in the wheel as the package ``rackplane_config`` (see pyproject.toml).
"""
