"""The stages a :class:`controller.core.brain.Brain` composes, each a module of functions on plain data.

  * :mod:`.ingest`   -- a telemetry batch checked and charged against the learned-state budget;
  * :mod:`.snapshot` -- learned state -> the policy's input (:class:`~controller.core.policy.types.PolicySnapshot`);
  * :mod:`.decide`   -- the decision per engine shape, its refresh period, and what is served when it fails;
  * :mod:`.wire`     -- a decision -> the engine's :class:`~controller.protocol.Policy` (overrides, cells, curves);
  * :mod:`.reads`    -- the views and metric rows the service shows;
  * :mod:`.evict`    -- what the idle sweep forgets;
  * :mod:`.persist`  -- a snapshot read back and checked.

Everything but ingest's apply and the wire's version counter is a read: it leaves the learned state as it was
(decayed figures are computed on aged copies, :meth:`controller.core.decay.Decayed.aged`).
"""
