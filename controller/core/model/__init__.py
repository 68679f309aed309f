"""The controller's models: the closed-loop batch goodput of a per-category configuration (:mod:`.batch`) and
the search over configurations (:mod:`.search`). The models the engine shares (cell table, width rule, token
budget, measured check) are in ``specctl_vllm.kernel.model``.

Pure code on plain data (no I/O, no clock): the controller decides with the batch model, and ``specctl
replay`` and the simulator score and rank configurations with the same batch model and search. See README.md
in this folder for the formulas, inputs, defaults and trade-offs.
"""
