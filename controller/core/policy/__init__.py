"""Policies: pure functions ``decide(snapshot, config) -> Decision`` over plain data (one per module)."""
