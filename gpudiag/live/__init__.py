"""The live path of ``gpudiag run``: readers of the run directory while the job writes it.

It sits beside collect, not in it (docs/concepts.md): collect writes, the monitor reads the
same files through the traces loaders and judges them with the analysis rules. Its lint
config (``gpudiag/live/ruff.toml``) bans imports of collect, report, api and cli.
"""
