"""``python -m gpudiag`` calls :func:`gpudiag.cli.main`."""

from gpudiag.cli import main

if __name__ == "__main__":
    main()
