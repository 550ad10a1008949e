"""Allow ``python -m gpumetrics``; the same entry point as the ``gpumetrics`` console script."""

from gpumetrics.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
