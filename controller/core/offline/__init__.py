"""Offline evaluation on recorded traffic: ``specctl replay`` (:mod:`.replay`, :mod:`.replay_path`), its what-if
goodput model (:mod:`.whatif`), request token traces (:mod:`.token_traces`) and the acceptance-EMA tiers
baseline (:mod:`.ema_tiers`). Used by the CLI, the simulators and the benchmarks, never by the live service.

Pure code on plain data (no I/O, no clock).
"""
