"""The step model, in one place: the per-(batch bucket, width) step-cost cell table and the width rule.

Pure code on plain data (no I/O, no clock): the controller learns the table (:mod:`.cells`), the engine patch
picks each step's width with it (:mod:`.widths`), and ``specctl replay`` and the simulator score configurations
with the same two functions. See README.md in this folder for the formula, inputs, defaults and trade-offs.
"""
