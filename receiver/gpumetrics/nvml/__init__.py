"""Everything that talks to NVML: library lifecycle, queries, device state, collectors.

``gpumetrics.nvml`` is the only package that imports ``pynvml`` (nvidia-ml-py). The public entry
points are :class:`gpumetrics.nvml.settings.CollectionSettings` and
:class:`gpumetrics.nvml.collector.Collector`. The simulated driver tests and ``--simulate`` run
on is a separate distribution, ``nvmlsim``, that sits beneath ``pynvml``; nothing here imports
it. This ``__init__`` imports nothing, so importing one module does not pull in the others.
"""
