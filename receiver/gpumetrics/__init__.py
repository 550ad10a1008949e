"""gpumetrics: NVIDIA GPU metrics from NVML as OTLP, served over a gRPC pull endpoint.

The package layout follows ``docs/architecture.md``: ``metrics`` (model and OTLP encoding),
``nvml`` (the only code importing ``pynvml``, plus the simulated driver in ``nvml.sim``),
``identity`` (per-process resources), ``store`` (sequenced batches), ``service`` (gRPC),
``config`` and ``cli``.
"""

__version__ = "0.1.0"
