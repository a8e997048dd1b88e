"""Runs that did not end well: stuck and mismatched collectives, failures."""
