"""``python -m gpudiag`` calls :func:`gpudiag.cli.main.main`."""

from gpudiag.cli.main import main

if __name__ == "__main__":
    main()
