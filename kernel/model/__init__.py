"""The step models the controller and the engine share: the per-(batch bucket, width) step-cost table
(:mod:`.cells`), the width rule (:mod:`.widths`), the token-budget model (:mod:`.budget`) and the measured
check on the width rule (:mod:`.measured`).

Pure code on plain data (no I/O, no clock): the controller learns the table and sends it, the engine patch
picks each step's width with it. The controller-only models (batch goodput, the search) are in
``specctl_vllm.controller.core.model``. controller/core/model/README.md gives the formulas, inputs, defaults
and trade-offs of both.
"""
