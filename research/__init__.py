"""The lab beside the product (not in the wheel): experiment grids (`experiment`, its spec and
tables), ensembles, widening, slimming checkpoints to carry them to a lent GPU (`gpu-lease/`), and
the analyses behind docs/experiments.md (`analyses/`). Run from a checkout: `python -m research
COMMAND ...`.

May import anything in the repository; nothing in `disan`, `model_export`, `service` or `bench`
imports it.
"""
