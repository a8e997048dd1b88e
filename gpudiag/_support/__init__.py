"""Helpers for every layer: records, lazy regexes, numpy helpers, file access, nsys."""
