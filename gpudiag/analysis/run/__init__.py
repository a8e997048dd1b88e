"""Across ranks: collectives, summaries, reconciliation, whole-run stats, live rules."""
