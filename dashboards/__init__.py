"""Grafana dashboards for specctl, generated from Python.

Edit the panels in the dashboard modules (``categories``, ``engines``, ``controller``) and run
``python -m dashboards.generate``; never edit the JSON under ``dashboards/grafana/`` by hand.
``python -m dashboards.generate --check`` fails when a committed file is stale (CI runs it).
"""
