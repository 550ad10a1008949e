"""Everything that talks to NVML: library lifecycle, queries, device state, collectors.

``gpumetrics.nvml`` is the only package that imports ``pynvml`` (nvidia-ml-py). The public entry
points are :class:`gpumetrics.nvml.settings.CollectionSettings` and
:class:`gpumetrics.nvml.collector.Collector`; the simulated driver lives in
:mod:`gpumetrics.nvml.sim`. This ``__init__`` imports nothing, so importing the simulator does not
pull in the collectors (and the reverse).
"""
