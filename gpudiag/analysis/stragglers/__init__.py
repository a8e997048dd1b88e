"""Stragglers: the step matrix, slow ranks, late arrival, their cause, and busy hosts."""
