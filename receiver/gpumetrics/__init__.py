"""gpumetrics: NVIDIA GPU metrics from NVML as OTLP, served over a gRPC pull endpoint.

The package layout follows ``docs/architecture.md``: ``metrics`` (model and OTLP encoding),
``nvml`` (the only code importing ``pynvml``), ``identity`` (per-process resources), ``store``
(sequenced batches), ``service`` (gRPC), ``runtime`` (wiring), ``config`` and ``cli``. The
simulated NVML driver behind ``--simulate`` is a separate distribution, ``nvmlsim``.
"""

__version__ = "0.1.0"
