"""Findings of one kind each: idle ratio, compute, variability, host causes."""
