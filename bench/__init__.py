"""Reproducible benchmarks; each module writes its JSON figures into ``bench/results/``.

One entry point, run from the repository root: ``python -m bench <name> [args...]`` (``python -m bench --list``;
the registry is in ``bench/__main__.py``). Shared process helpers: ``bench/harness.py``.
"""
