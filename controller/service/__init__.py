"""The controller's I/O edge: HTTP API, auth, SQLite store, metrics collector, settings, logs.

Everything here is a thin shell around :mod:`specctl_vllm.controller.core` (pure logic, no I/O). Objects are built
in :func:`specctl_vllm.controller.service.app.create_app`'s lifespan, never at import time, and the clock is injected.
"""
