"""Reproducible benchmarks; each module writes its JSON figures into ``bench/results/``."""
