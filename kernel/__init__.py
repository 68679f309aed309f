"""The kernel both sides share: what the controller and the engine patch must agree on, in one place.

* :mod:`.protocol`: the wire protocol (telemetry, acks, policy) and the category names;
* :mod:`.drafters`, :mod:`.proposers`: the draft methods and the model-free proposers;
* :mod:`.adapt`: the per-request adaptation rule the engine runs within the controller's bounds;
* :mod:`.cost`, :mod:`.decay`: the step-cost model and time decay;
* :mod:`.model`: the per-(batch bucket, width) step-cost table, the width rule and the measured check.

The controller and the engine patch import this package; it imports neither of them
(tests/unit/test_layering.py), so the engine never loads controller code and the two never disagree on a
formula or a field. Pure code on plain data: no I/O, no clock.
"""
