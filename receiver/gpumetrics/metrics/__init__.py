"""The metrics model (pure Python, no ``pynvml``): catalogue, buffers, producer, OTLP encoding.

Re-exports the seed's names: the metric and attribute constants from :mod:`.names`, :class:`GPU`
and :func:`CountNVIDIAGPUs`, :class:`MetricBuffer`, :class:`Producer` and the
:class:`ProcessResourcer` protocol.
"""

from gpumetrics.metrics.buffer import Attributes, MetricBuffer, Point, UnknownMetricError
from gpumetrics.metrics.encode import EncodingError, count_points, encode_attributes, encode_metric
from gpumetrics.metrics.gpu import GPU, CountNVIDIAGPUs
from gpumetrics.metrics.names import *  # noqa: F403 - the seed's constants are the public API
from gpumetrics.metrics.producer import CollectionParts, ProcessResourcer, Producer
from gpumetrics.metrics.spec import Catalogue, Instrument, MetricSpec, Scope, ValueType, catalogue

__all__ = [
    "Attributes",
    "Catalogue",
    "CollectionParts",
    "CountNVIDIAGPUs",
    "EncodingError",
    "GPU",
    "Instrument",
    "MetricBuffer",
    "MetricSpec",
    "Point",
    "ProcessResourcer",
    "Producer",
    "Scope",
    "UnknownMetricError",
    "ValueType",
    "catalogue",
    "count_points",
    "encode_attributes",
    "encode_metric",
]
