import math

import pytest
from gpumetrics.metrics import MetricBuffer, UnknownMetricError, catalogue, names

T = 1_700_000_000_000_000_000


@pytest.fixture
def buf():
    return MetricBuffer(catalogue().metrics)


def test_points_creates_the_metric_on_first_use_and_returns_the_same_list(buf):
    pts = buf.points(names.MetricPower)
    assert pts == [] and buf.points(names.MetricPower) is pts
    assert not buf  # a metric with no points is not content


def test_unknown_metric_name_is_an_error(buf):
    with pytest.raises(UnknownMetricError, match="hw.gpu.nonsense"):
        buf.points("hw.gpu.nonsense")
    with pytest.raises(UnknownMetricError):
        buf.add("hw.gpu.nonsense", 1.0, T)


@pytest.mark.parametrize(
    ("name", "value", "start", "message"),
    [
        (names.MetricGPUUtilization, 1.01, 0, "outside"),
        (names.MetricGPUUtilization, -0.01, 0, "outside"),
        (names.MetricPower, math.nan, 0, "not finite"),
        (names.MetricPower, math.inf, 0, "not finite"),
        (names.MetricGPUMemoryUsage, 1.5, T, "int metric"),
        (names.MetricGPUMemoryUsage, 10, 0, "start_time"),
        (names.MetricEnergy, 1.0, 0, "start_time"),
        (names.MetricPower, True, 0, "not a number"),
        (names.MetricPower, None, 0, "not a number"),
    ],
)
def test_add_rejects_points_that_break_the_spec(buf, name, value, start, message):
    with pytest.raises(ValueError, match=message) as exc:
        buf.add(name, value, T, (), start)
    assert name in str(exc.value)
    assert len(buf) == 0


def test_add_accepts_valid_points_in_order(buf):
    buf.add(names.MetricGPUUtilization, 0.0, T)
    buf.add(names.MetricGPUUtilization, 1.0, T + 1)
    buf.add(names.MetricGPUMemoryUsage, 0, T, (), T - 5)
    assert [p.value for p in buf.points(names.MetricGPUUtilization)] == [0.0, 1.0]
    assert len(buf) == 3
    assert [s.name for s, _ in buf.items()] == [
        names.MetricGPUUtilization,
        names.MetricGPUMemoryUsage,
    ]


def test_time_must_be_positive(buf):
    with pytest.raises(ValueError, match="time_unix_nano"):
        buf.add(names.MetricPower, 1.0, 0)
