"""Benchmarks: offline encoder throughput, service load (bench/load.py), results in RESULTS.md."""
