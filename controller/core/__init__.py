"""Pure controller logic: learning, cost model, entropy class, policies, overrides.

Nothing in this package does I/O, reads a clock or touches a socket or a file: every function takes plain
data (and ``now`` where time matters) and returns plain data. :class:`specctl_vllm.controller.core.brain.Brain` is the
composition root the service holds one of per application.
"""
