"""Remedies: the advice table and one module per bottleneck's remedies."""
