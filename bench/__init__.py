"""Reproducible benchmarks; each module writes its JSON figures into ``bench/results/``.

That folder is git-ignored: tracked there are only the summaries README.md, docs/ and the bench READMEs quote
(tests/unit/bench/test_results.py holds both ways), and a rerun refreshes them in place.

One entry point, run from the repository root: ``python -m bench <name> [args...]`` (``python -m bench --list``;
the registry is in ``bench/__main__.py``). Shared process helpers: ``bench/harness.py``.
"""
