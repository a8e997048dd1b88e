"""The run directory: layout, manifest and run conditions (collect → traces)."""
