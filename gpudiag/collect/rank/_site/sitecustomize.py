"""gpudiag's bootstrap, first on PYTHONPATH under ``gpudiag run``; chains to the next one."""


def _gpudiag_boot() -> None:
    import os
    import sys

    here = os.path.dirname(os.path.abspath(__file__))
    try:
        try:
            from gpudiag.collect.rank import bootstrap
        except ImportError:
            root = os.environ.get("GPUDIAG_PKG_ROOT")
            if not root:
                raise
            # Appended, not prepended: gpudiag must not shadow the job's own modules.
            sys.path.append(root)
            from gpudiag.collect.rank import bootstrap
        bootstrap.boot(here)
    except Exception as e:  # never break the job's interpreter start-up
        sys.stderr.write(f"gpudiag: bootstrap failed, this process is not instrumented ({e})\n")
        try:
            from gpudiag.collect.rank import bootstrap as b

            if "_gpudiag_chained_sitecustomize" not in sys.modules:
                b.chain_sitecustomize(here)
        except Exception:
            pass


_gpudiag_boot()
del _gpudiag_boot
