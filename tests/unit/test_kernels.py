"""The compiled kernels (``_wire.c``) give exactly what the pure-Python ones give.

``gpumetrics.metrics.kernels`` is the reference; ``gpumetrics.metrics._wire`` is built by
``pip install`` where a C compiler is present (``setup.py``, optional). Random columns
(hypothesis) go through both and the bytes must be equal; the bytes must also parse as the
OTLP messages they claim to be. ``tests/nvml/test_bulk_encode.py`` runs every simulated
scenario through the producer with each kernel.
"""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from array import array
from pathlib import Path
from typing import Any

import pytest
from gpumetrics.metrics import bulk, kernels
from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2
from opentelemetry.proto.metrics.v1 import metrics_pb2

ROOT = Path(__file__).resolve().parents[2]
INT64 = st.integers(-(2**63), 2**63 - 1)
compiled: Any = bulk._compiled


def test_the_compiled_kernels_are_built_where_a_c_compiler_is():
    if shutil.which("cc") is None and shutil.which("gcc") is None:
        pytest.skip("no C compiler on this machine: the pure-Python kernels are what runs")
    assert compiled is not None, "a C compiler is present but gpumetrics.metrics._wire is absent"
    assert bulk.kernels_in_use() == "compiled"


needs_compiled = pytest.mark.skipif(compiled is None, reason="_wire not built (no C compiler)")


@st.composite
def point_columns(draw: Any) -> dict[str, Any]:
    n = draw(st.integers(0, 40))
    heads = [
        bytes([0x0A, k]) + b"a" * draw(st.integers(0, 3)) for k in range(draw(st.integers(1, 4)))
    ]
    as_int = draw(st.booleans())
    values = (
        array("q", draw(st.lists(INT64, min_size=n, max_size=n)))
        if as_int
        else array("d", draw(st.lists(st.floats(allow_nan=False), min_size=n, max_size=n)))
    )
    per_row = draw(st.booleans())
    return {
        "heads": [heads[draw(st.integers(0, len(heads) - 1))] for _ in range(n)]
        if per_row
        else heads,
        "head_index": None
        if per_row
        else array("I", draw(st.lists(st.integers(0, len(heads) - 1), min_size=n, max_size=n))),
        "times": array("q", draw(st.lists(INT64, min_size=n, max_size=n))),
        "values": values,
        "starts": draw(
            st.one_of(st.none(), st.just(array("q", draw(st.lists(INT64, min_size=n, max_size=n)))))
        ),
        "as_int": as_int,
        "order": draw(
            st.one_of(
                st.none(),
                st.lists(st.integers(0, n - 1), max_size=2 * n).map(lambda o: array("q", o))
                if n
                else st.none(),
            )
        ),
    }


@needs_compiled
@settings(max_examples=300, deadline=None)
@given(cols=point_columns())
def test_pack_points_equals_the_pure_python_kernel(cols):
    args = (cols["heads"], cols["head_index"], cols["times"], cols["values"], cols["starts"])
    got = compiled.pack_points(*args, cols["as_int"], cols["order"])
    assert got == kernels.pack_points(*args, cols["as_int"], cols["order"])


def test_packed_points_parse_as_number_data_points():
    head = kernels_head = bulk.point_head((("hw.id", "GPU-1"),), True)
    del kernels_head
    data = bulk._kernels.pack_points(
        [head], array("I", [0, 0]), array("q", [5, 6]), array("d", [0.25, -0.0]),
        array("q", [1, 2]), False, array("q", [1, 0]),
    )  # fmt: skip
    gauge = metrics_pb2.Gauge.FromString(data)
    assert [(p.start_time_unix_nano, p.time_unix_nano, p.as_double) for p in gauge.data_points] == [
        (2, 6, -0.0),
        (1, 5, 0.25),
    ]
    assert gauge.data_points[0].attributes[0].value.string_value == "GPU-1"


@needs_compiled
@settings(max_examples=300, deadline=None)
@given(keys=st.lists(st.integers(-5, 5) | INT64, max_size=60))
def test_order_runs_equals_the_pure_python_kernel(keys):
    col = array("q", keys)
    order, runs = compiled.order_runs(col)
    want_order, want_runs = kernels.order_runs(col)
    assert list(memoryview(order).cast("q")) == list(want_order)
    assert runs == want_runs
    assert sorted(keys) == [keys[i] for i in want_order]


@st.composite
def framing(draw: Any) -> tuple[Any, ...]:
    pids = sorted(set(draw(st.lists(st.integers(1, 50), max_size=12))))
    kept = [p for p in pids if draw(st.booleans()) or p == pids[0]]
    resources = [b"\x0a\x03\x0a\x01" + bytes([p]) for p in kept]
    metrics = []
    for k in range(draw(st.integers(0, 3))):
        runs, blob = [], b""
        for p in pids:
            if draw(st.booleans()):
                dp = bytes([0x0A, 2, 0x08, p])
                runs.append((p, len(blob), len(blob) + len(dp), 1))
                blob += dp
        metrics.append((b"\x0a\x01" + bytes([0x61 + k]) + b"\x2a", b"", blob, runs))
    first = draw(st.one_of(st.none(), st.just([b"\x0a\x00"]), st.just([b"\x0a", b"\x00"])))
    budget = draw(st.one_of(st.just(0), st.integers(1, 64)))  # 0: no budget
    return first, 3, kept, resources, b"\x0a\x00", b"", metrics, budget


@needs_compiled
@settings(max_examples=300, deadline=None)
@given(args=framing())
def test_frame_resources_equals_the_pure_python_kernel(args):
    assert compiled.frame_resources(*args) == kernels.frame_resources(*args)


@needs_compiled
@settings(max_examples=300, deadline=None)
@given(args=framing())
def test_framed_parts_keep_the_budget_first_fit(args):
    parts, dropped = kernels.frame_resources(*args)
    first, budget = args[0], args[-1]
    sizes = [len(data) for data, _ in parts]
    if budget:
        assert sum(sizes) <= budget or (first is not None and len(parts) == 1)
    assert len(parts) - (first is not None) + len(dropped) == len(args[2])  # every pid, once


def _two_processes() -> tuple[Any, ...]:
    gauge = metrics_pb2.Metric(name="m")
    header = gauge.SerializeToString() + b"\x2a"
    blob = b"".join(
        metrics_pb2.Gauge(data_points=[metrics_pb2.NumberDataPoint(as_int=p)]).SerializeToString()
        for p in (1, 2)
    )
    half = len(blob) // 2
    resources = [bulk.resource_bytes([("process.pid", p)]) for p in (1, 2)]
    metrics = [(header, b"", blob, [(1, 0, half, 1), (2, half, len(blob), 1)])]
    return [1, 2], resources, b"\x0a\x00", b"", metrics


@pytest.mark.parametrize("which", ["python", "compiled"])
def test_framed_parts_parse_and_hold_each_process_once(which):
    if which == "compiled" and compiled is None:
        pytest.skip("_wire not built (no C compiler)")
    impl = compiled if which == "compiled" else kernels
    parts, dropped = impl.frame_resources(None, 0, *_two_processes(), 0)
    assert dropped == [] and [points for _, points in parts] == [1, 1]
    req = metrics_service_pb2.ExportMetricsServiceRequest.FromString(b"".join(d for d, _ in parts))
    assert [
        rm.scope_metrics[0].metrics[0].gauge.data_points[0].as_int for rm in req.resource_metrics
    ] == [1, 2]
    for data, _ in parts:  # each part is a request of one resource
        part = metrics_service_pb2.ExportMetricsServiceRequest.FromString(data)
        assert len(part.resource_metrics) == 1


@pytest.mark.parametrize("which", ["python", "compiled"])
def test_a_process_over_the_budget_is_left_out_and_the_first_part_kept(which):
    if which == "compiled" and compiled is None:
        pytest.skip("_wire not built (no C compiler)")
    impl = compiled if which == "compiled" else kernels
    ((one, _), (two, _)), _ = impl.frame_resources(None, 0, *_two_processes(), 0)
    host = [b"\x0a\x02", b"\x0a\x00"]  # a resource_metrics entry with an empty resource
    parts, dropped = impl.frame_resources(host, 7, *_two_processes(), 4 + len(one))
    assert parts == [(b"".join(host), 7), (one, 1)] and dropped == [(2, 1)]
    parts, dropped = impl.frame_resources(host, 7, *_two_processes(), 1)  # the host alone is over
    assert parts == [(b"".join(host), 7)] and dropped == [(1, 1), (2, 1)]
    assert len(two) == len(one)


def test_the_kernels_can_be_switched_and_refuse_nonsense():
    before = bulk.kernels_in_use()
    try:
        assert bulk.use_kernels("python") == "python"
        with pytest.raises(ValueError, match="auto, compiled or python"):
            bulk.use_kernels("fortran")
        assert bulk.use_kernels("auto") == ("compiled" if compiled is not None else "python")
    finally:
        bulk.use_kernels(before)


@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler on this machine")
def test_setup_py_builds_the_extension_with_only_a_c_compiler(tmp_path):
    """What ``pip install .`` runs for the extension (setuptools ``build_ext``), from scratch."""
    result = subprocess.run(
        [sys.executable, "setup.py", "-q", "build_ext", "--build-lib", str(tmp_path / "lib"),
         "--build-temp", str(tmp_path / "tmp")],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    (so,) = (tmp_path / "lib" / "gpumetrics" / "metrics").glob("_wire*")
    spec = importlib.util.spec_from_file_location("gpumetrics.metrics._wire", so)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    cols = (array("q", [3, 1, 3]),)
    order, runs = module.order_runs(*cols)
    assert runs == kernels.order_runs(*cols)[1] == [(1, 0, 1), (3, 1, 3)]
