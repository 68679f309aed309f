"""What the controller learns from telemetry, per model: acceptance per (category, method) (:mod:`.estimator`,
:mod:`.learner`), the batch mix (:mod:`.mix`), the step cost fitted online (:mod:`.cost_fit`), the entropy
class (:mod:`.entropy`), per-engine state (:mod:`.engines`) and the bound on all of it (:mod:`.budget`).

Pure code on plain data (no I/O, no clock); :class:`specctl_vllm.controller.core.brain.Brain` holds it.
"""
