"""The columnar boundary applies ``MetricBuffer.add``'s rules to every point, dropping and counting.

Every case ``MetricBuffer.add`` refuses (``test_buffer.py``) is refused by ``Producer.commit`` too,
whether it arrives as a device point (``Points.add``) or as a row of a per-process table
(``ProcessBlock``), and counted in the ``refused`` total the collector reports as
``gpumetrics.values.dropped{reason=invalid_point}``; the valid points around it are kept, in order.
"""

import math
from array import array
from fractions import Fraction

import pytest
from gpumetrics.metrics import MetricBuffer, catalogue, names
from gpumetrics.metrics.columns import MetricColumns, Points, ProcessColumns, check
from gpumetrics.metrics.encode import count_points
from gpumetrics.metrics.producer import Producer

T = 1_700_000_000_000_000_000
GPU = (("hw.id", "GPU-1"),)

BAD = [
    (names.MetricGPUUtilization, 1.01, T, 0),
    (names.MetricGPUUtilization, -0.01, T, 0),
    (names.MetricPower, math.nan, T, 0),
    (names.MetricPower, math.inf, T, 0),
    (names.MetricPower, -math.inf, T, 0),
    (names.MetricGPUMemoryUsage, 1.5, T, T),
    (names.MetricGPUMemoryUsage, 10, T, 0),
    (names.MetricEnergy, 1.0, T, 0),
    (names.MetricPower, True, T, 0),
    (names.MetricPower, None, T, 0),
    (names.MetricPower, "1.0", T, 0),
    (names.MetricPower, Fraction(1, 2), T, 0),
    (names.MetricPower, 1.0, 0, 0),
    (names.MetricPower, 1.0, -5, 0),
]
"""``(metric, value, time, start)`` that ``MetricBuffer.add`` refuses."""

PROCESS_BAD = [
    (names.MetricProcessUtilization, 1.5, T, 0),
    (names.MetricProcessUtilization, math.nan, T, 0),
    (names.MetricProcessMemoryUsage, 7.5, T, T),
    (names.MetricProcessMemoryUsage, 7, T, 0),
    (names.MetricProcessMemoryUsage, True, T, T),
    (names.MetricProcessUtilization, 0.5, 0, 0),
]


@pytest.mark.parametrize(("metric", "value", "time", "start"), BAD)
def test_metric_buffer_refuses_each_bad_case(metric, value, time, start):
    with pytest.raises(ValueError):
        MetricBuffer(catalogue().metrics).add(metric, value, time, (), start)


@pytest.mark.parametrize(("metric", "value", "time", "start"), BAD)
def test_commit_drops_and_counts_a_bad_device_point(metric, value, time, start):
    p = Producer()
    pts = Points()
    pts.add(metric, 0 if metric == names.MetricGPUMemoryUsage else 0.5, T, GPU, T)
    pts.add(metric, value, time, GPU, start)
    pts.add(metric, 1 if metric == names.MetricGPUMemoryUsage else 0.25, T + 1, GPU, T)
    added, refused = p.commit(pts)
    assert (added, refused) == (2, 1)
    req = p.collect()
    (m,) = req.resource_metrics[0].scope_metrics[0].metrics
    data = m.sum if m.HasField("sum") else m.gauge
    assert [dp.time_unix_nano for dp in data.data_points] == [T, T + 1]  # order kept


@pytest.mark.parametrize(("metric", "value", "time", "start"), PROCESS_BAD)
def test_commit_drops_and_counts_a_bad_process_row(metric, value, time, start):
    good = 3 if metric == names.MetricProcessMemoryUsage else 0.5
    with pytest.raises(ValueError):
        MetricBuffer(catalogue().metrics).add(metric, value, time, (), start)
    p = Producer()
    pts = Points()
    pts.block(metric, GPU, [10, 11, 12], [good, value, good], [T, time, T], [T, start, T])
    assert p.commit(pts) == (2, 1)
    req = p.collect()
    pids = [rm.resource.attributes[0].value.int_value for rm in req.resource_metrics]
    assert pids == [10, 12]


def test_a_process_row_with_a_pid_that_is_not_positive_is_refused():
    p = Producer()
    pts = Points()
    pts.block(names.MetricProcessUtilization, GPU, [0, 5, -3], [0.1, 0.2, 0.3], T)
    assert p.commit(pts) == (1, 2)


def test_typed_blocks_take_the_fast_path_and_keep_every_row():
    p = Producer()
    pts = Points()
    pids = array("q", range(1, 1001))
    pts.block(names.MetricProcessUtilization, GPU, pids, array("d", [0.5] * 1000), T)
    pts.block(
        names.MetricProcessMemoryUsage,
        GPU,
        pids,
        array("q", range(1000)),
        T,
        array("q", [T] * 1000),
    )
    assert p.commit(pts) == (2000, 0)
    assert count_points(p.collect()) == 2000


def test_check_filters_a_column_point_by_point_only_when_a_scan_fails():
    mc = MetricColumns(catalogue().metrics[names.MetricGPUUtilization])
    for v in (0.0, 0.5, 1.0):
        assert mc.add(v, T, GPU, 0)
    assert check(mc) == 0 and len(mc) == 3
    assert mc.add(2.0, T, GPU, 0)  # the type is right; the range is checked as a column
    assert check(mc) == 1 and list(mc.values) == [0.0, 0.5, 1.0]


def test_process_columns_order_rows_by_pid_keeping_arrival_order():
    spec = catalogue().metrics[names.MetricProcessUtilization]
    pc = ProcessColumns(spec)
    for pid, v in ((7, 0.1), (3, 0.2), (7, 0.3), (3, 0.4)):
        assert pc.add(pid, v, T, GPU, 0)
    views = pc.by_pid()
    assert list(views[7].values) == [0.1, 0.3] and list(views[3].values) == [0.2, 0.4]


def test_an_int_outside_int64_is_refused_not_a_failed_batch():
    """``MetricBuffer.add`` lets it through and the protobuf API cannot write it (``as_int`` is
    sfixed64): before the columns the whole ``collect`` failed; now the point is counted."""
    buf = MetricBuffer(catalogue().metrics)
    buf.add(names.MetricGPUMemoryUsage, 2**63, T, (), T)
    p = Producer()
    pts = Points()
    pts.add(names.MetricGPUMemoryUsage, 2**63, T, GPU, T)
    pts.add(names.MetricGPUMemoryUsage, 2**62, T, GPU, T)
    assert p.commit(pts) == (1, 1)
    assert count_points(p.collect()) == 1
