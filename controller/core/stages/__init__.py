"""The stages a :class:`specctl_vllm.controller.core.brain.Brain` composes, each a module of functions on plain data.

  * :mod:`.ingest`   -- a telemetry batch checked, charged against the learned-state budget, then learned from;
  * :mod:`.snapshot` -- learned state -> the policy's input (:class:`~specctl_vllm.controller.core.policy.types.PolicySnapshot`);
  * :mod:`.decide`   -- the decision per engine shape, its refresh period, and what is served when it fails;
  * :mod:`.wire`     -- a decision -> the engine's :class:`~specctl_vllm.kernel.protocol.Policy` (overrides, cells, curves);
  * :mod:`.reads`    -- the views and metric rows the service shows;
  * :mod:`.evict`    -- what the idle sweep or a smaller budget forgets, and the series the rest is charged;
  * :mod:`.persist`  -- a snapshot read back and checked.

Only ingest (:func:`~.ingest.apply`, and the engine's own duplicate and conflict counters in
:func:`~.ingest.admit`) and evict (:func:`~.evict.drop`, :func:`~.evict.stamp_unseen`) write the dictionaries they
are given; everything else is a read that leaves the learned state as it was (decayed figures are computed on aged
copies, :meth:`specctl_vllm.kernel.decay.Decayed.aged`), and the wire is handed the version counter and gives back the
next one.
"""
