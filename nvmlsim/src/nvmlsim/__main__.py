"""``python -m gpumetrics.nvml.sim``: see :mod:`gpumetrics.nvml.sim.launcher`."""

from gpumetrics.nvml.sim.launcher import main

if __name__ == "__main__":
    raise SystemExit(main())
