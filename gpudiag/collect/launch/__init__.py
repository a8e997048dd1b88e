"""The launcher side of ``gpudiag run``/``attach``: spawn, supervise, finish."""
