"""Pure controller logic, grouped by role: :mod:`.learn` (what is learned from telemetry), :mod:`.policy` (the
decision), :mod:`.model` (the batch model and the search), :mod:`.offline` (``specctl replay`` and its
what-if model), :mod:`.stages` (the brain's pipeline), and beside them the brain, its config, overrides and
views. The models the engine shares (cost, decay, step cells, width rule) are in ``specctl_vllm.kernel``.

Nothing in this package does I/O, reads a clock or touches a socket or a file: every function takes plain
data (and ``now`` where time matters) and returns plain data. :class:`specctl_vllm.controller.core.brain.Brain`
is the composition root the service holds one of per application.
"""
