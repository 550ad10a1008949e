"""Build the optional compiled kernels of the OTLP encoder (everything else is in pyproject.toml).

``gpumetrics.metrics._wire`` (``receiver/gpumetrics/metrics/_wire.c``) is built when a C
compiler and the Python headers are present and is optional: without them the install goes
on and ``gpumetrics.metrics.bulk`` uses its pure-Python kernels, which give the same bytes
(setuptools: https://setuptools.pypa.io/en/latest/userguide/ext_modules.html).
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "gpumetrics.metrics._wire",
            sources=["receiver/gpumetrics/metrics/_wire.c"],
            optional=True,
        )
    ]
)
