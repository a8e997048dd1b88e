"""Per-rank work fanned out: local processes or a Dask cluster, and the on-disk cache around it."""
