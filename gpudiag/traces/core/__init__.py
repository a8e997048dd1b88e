"""The loader core every format shares: options, patterns, steps, rank builder."""
