"""Comparing runs: the gate, its statistics, baselines and diffs."""
