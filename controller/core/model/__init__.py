"""The models, in one place: the per-(batch bucket, width) step-cost table (:mod:`.cells`), the width rule
(:mod:`.widths`), the closed-loop batch goodput of a per-category configuration (:mod:`.batch`) and the search
over configurations (:mod:`.search`).

Pure code on plain data (no I/O, no clock): the controller learns the table and decides with the batch model,
the engine patch picks each step's width with the table, and ``specctl replay`` and the simulator score and
rank configurations with the same batch model and search. See README.md in this folder for the formulas,
inputs, defaults and trade-offs.
"""
