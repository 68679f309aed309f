"""Trace-driven simulator of speculative decoding at batch sizes this machine cannot run (``python -m bench sim``, bench/sim/run.py)."""
