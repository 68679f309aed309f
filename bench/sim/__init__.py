"""Trace-driven simulator of speculative decoding at batch sizes this machine cannot run (see bench/sim.py)."""
