"""Analyses that answer one research question each (not benchmarks of the product): run as
`python -m research.analyses.NAME` from a checkout."""
