"""GPM through the real nvidia-ml-py: support, buffers, samples, metrics, MIG GPU instances."""

from __future__ import annotations

from typing import Any

import pynvml
import pytest

from .sim_helpers import UUID0

MIG_PARENT = "GPU-00000000-0000-4000-8000-0000000000a0"


def _scenario(**gpm: Any) -> dict[str, Any]:
    return {
        "format": 1,
        "devices": [
            {
                "uuid": UUID0,
                "gpm": gpm
                or {
                    "metrics": {
                        "SM_UTIL": {"pattern": "trace", "values": [40, 60, 80]},
                        "SM_OCCUPANCY": 25,
                        "PCIE_TX_PER_SEC": 512,
                    }
                },
            },
            {"uuid": "GPU-00000000-0000-4000-8000-000000000001"},  # pre-Hopper: no gpm
            {
                "uuid": MIG_PARENT,
                "gpm": {"metrics": {"SM_UTIL": 50}},
                "mig": {
                    "current": "enabled",
                    "instances": [
                        {
                            "slot": 0,
                            "gpu_instance_id": 1,
                            "compute_instance_id": 0,
                            "uuid": "MIG-00000000-0000-5000-8000-000000000001",
                            "gpm": {"metrics": {"SM_UTIL": 90}},
                        },
                        {
                            "slot": 1,
                            "gpu_instance_id": 2,
                            "compute_instance_id": 0,
                            "uuid": "MIG-00000000-0000-5000-8000-000000000002",
                        },
                    ],
                },
            },
        ],
    }


def _metrics(first: Any, second: Any, ids: list[int]) -> Any:
    req = pynvml.c_nvmlGpmMetricsGet_t()
    req.version = pynvml.NVML_GPM_METRICS_GET_VERSION
    req.numMetrics = len(ids)
    req.sample1, req.sample2 = first, second
    for i, metric_id in enumerate(ids):
        req.metrics[i].metricId = metric_id
    return pynvml.nvmlGpmMetricsGet(req)


def test_support_is_reported_for_gpm_devices_only(simulate):
    simulate(_scenario())
    hopper, ampere = (pynvml.nvmlDeviceGetHandleByIndex(i) for i in (0, 1))
    assert pynvml.nvmlGpmQueryDeviceSupport(hopper).isSupportedDevice == 1
    assert pynvml.nvmlGpmQueryDeviceSupport(ampere).isSupportedDevice == 0
    buf = pynvml.nvmlGpmSampleAlloc()
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlGpmSampleGet(ampere, buf)
    pynvml.nvmlGpmSampleFree(buf)


def test_metrics_are_the_interval_means_of_the_scenario_with_per_metric_returns(simulate):
    drv = simulate(_scenario(), latency="off")
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    a, b = pynvml.nvmlGpmSampleAlloc(), pynvml.nvmlGpmSampleAlloc()
    assert drv.gpm_samples_live == 2
    pynvml.nvmlGpmSampleGet(h, a)
    drv.next_cycle()
    pynvml.nvmlGpmSampleGet(h, b)
    sm, occupancy, pcie, fp64 = (
        pynvml.NVML_GPM_METRIC_SM_UTIL,
        pynvml.NVML_GPM_METRIC_SM_OCCUPANCY,
        pynvml.NVML_GPM_METRIC_PCIE_TX_PER_SEC,
        pynvml.NVML_GPM_METRIC_FP64_UTIL,
    )
    req = _metrics(a, b, [sm, occupancy, pcie, fp64])
    got = [(m.metricId, m.nvmlReturn, m.value) for m in req.metrics[:4]]
    # the trace is per cycle: 40 in cycle 1, 60 in cycle 2; the interval is [cycle 1, cycle 2)
    assert got == [
        (sm, 0, 40.0),
        (occupancy, 0, 25.0),
        (pcie, 0, 512.0),
        (fp64, pynvml.NVML_ERROR_NOT_SUPPORTED, 0.0),
    ]
    assert req.metrics[0].metricInfo.unit == b"%" and req.metrics[2].metricInfo.unit == b"MiB/s"
    assert req.metrics[0].metricInfo.shortName == b"sm_util"
    for buf in (a, b):
        pynvml.nvmlGpmSampleFree(buf)
    assert drv.gpm_samples_live == 0 and drv.violations == []


def test_samples_closer_than_100_ms_give_zero(simulate):
    drv = simulate(_scenario(), latency="off")
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    a, b = pynvml.nvmlGpmSampleAlloc(), pynvml.nvmlGpmSampleAlloc()
    pynvml.nvmlGpmSampleGet(h, a)
    drv.advance(0.05)
    pynvml.nvmlGpmSampleGet(h, b)
    req = _metrics(a, b, [pynvml.NVML_GPM_METRIC_SM_OCCUPANCY])
    assert (req.metrics[0].nvmlReturn, req.metrics[0].value) == (0, 0.0)


def test_gpm_values_may_be_nan_or_infinite(simulate):
    """A real GPM answer can be non-finite (issue 28 item 9); the format refused NaN and Inf."""
    import math

    metrics = {
        "SM_UTIL": float("nan"),
        "PCIE_TX_PER_SEC": float("inf"),
        "SM_OCCUPANCY": {"pattern": "trace", "values": [20, float("-inf")]},
    }
    drv = simulate(_scenario(metrics=metrics), latency="off")
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    a, b, c = (pynvml.nvmlGpmSampleAlloc() for _ in range(3))
    pynvml.nvmlGpmSampleGet(h, a)
    drv.next_cycle()
    pynvml.nvmlGpmSampleGet(h, b)
    drv.next_cycle()
    pynvml.nvmlGpmSampleGet(h, c)
    ids = [
        pynvml.NVML_GPM_METRIC_SM_UTIL,
        pynvml.NVML_GPM_METRIC_PCIE_TX_PER_SEC,
        pynvml.NVML_GPM_METRIC_SM_OCCUPANCY,
    ]
    first = [m.value for m in _metrics(a, b, ids).metrics[:3]]
    second = [m.value for m in _metrics(b, c, ids).metrics[:3]]
    assert math.isnan(first[0]) and first[1:] == [math.inf, 20.0]
    assert second[2] == -math.inf  # the interval of the trace's -Inf step
    for buf in (a, b, c):
        pynvml.nvmlGpmSampleFree(buf)


def test_mig_gpu_instance_samples_have_the_instance_values(simulate):
    drv = simulate(_scenario(), latency="off")
    parent = pynvml.nvmlDeviceGetHandleByIndex(2)
    whole = [pynvml.nvmlGpmSampleAlloc() for _ in range(2)]
    gi1 = [pynvml.nvmlGpmSampleAlloc() for _ in range(2)]
    gi2 = [pynvml.nvmlGpmSampleAlloc() for _ in range(2)]
    for k in range(2):
        pynvml.nvmlGpmSampleGet(parent, whole[k])
        pynvml.nvmlGpmMigSampleGet(parent, 1, gi1[k])
        pynvml.nvmlGpmMigSampleGet(parent, 2, gi2[k])
        drv.next_cycle()
    sm = pynvml.NVML_GPM_METRIC_SM_UTIL
    assert _metrics(*whole, [sm]).metrics[0].value == 50.0
    assert _metrics(*gi1, [sm]).metrics[0].value == 90.0
    assert _metrics(*gi2, [sm]).metrics[0].nvmlReturn == pynvml.NVML_ERROR_NOT_SUPPORTED
    with pytest.raises(pynvml.NVMLError_InvalidArgument):  # no GPU instance 7
        pynvml.nvmlGpmMigSampleGet(parent, 7, whole[0])
    with pytest.raises(pynvml.NVMLError_InvalidArgument):  # samples of two sources
        _metrics(whole[0], gi1[1], [sm])
    with pytest.raises(pynvml.NVMLError_NotSupported):  # no MIG on device 0
        pynvml.nvmlGpmMigSampleGet(pynvml.nvmlDeviceGetHandleByIndex(0), 1, whole[0])


def test_free_of_an_unknown_buffer_is_a_violation(simulate):
    drv = simulate(_scenario())
    buf = pynvml.nvmlGpmSampleAlloc()
    pynvml.nvmlGpmSampleFree(buf)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlGpmSampleFree(buf)
    assert [v.kind for v in drv.violations] == ["invalid_handle"]


def test_a_wrong_struct_version_answers_the_drivers_code(simulate):
    drv = simulate(_scenario(), latency="off")
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    a, b = pynvml.nvmlGpmSampleAlloc(), pynvml.nvmlGpmSampleAlloc()
    pynvml.nvmlGpmSampleGet(h, a)
    drv.next_cycle()
    pynvml.nvmlGpmSampleGet(h, b)
    req = pynvml.c_nvmlGpmMetricsGet_t()
    req.version, req.numMetrics, req.sample1, req.sample2 = 2, 0, a, b
    with pytest.raises(pynvml.NVMLError_ArgumentVersionMismatch):  # driver 570: code 25
        pynvml.nvmlGpmMetricsGet(req)


def test_old_drivers_lack_the_gpm_symbols(simulate):
    data = _scenario()
    data["driver"] = {"profile": "470"}
    del data["devices"][2]  # no MIG on 470's symbol set matters here
    simulate(data)
    with pytest.raises(pynvml.NVMLError_FunctionNotFound):
        pynvml.nvmlGpmQueryDeviceSupport(pynvml.nvmlDeviceGetHandleByIndex(0))


def test_gpm_scenario_errors_name_the_field():
    import nvmlsim as sim

    data = _scenario(metrics={"SM_UTILS": 3})
    with pytest.raises(sim.ScenarioError, match="unknown GPM metric 'SM_UTILS'"):
        sim.scenario_from_data(data)
    data = _scenario(metrics={"SM_UTIL": 140})
    with pytest.raises(sim.ScenarioError, match=r"devices\[0\]\.gpm\.metrics\[2\]"):
        sim.scenario_from_data(data)


@pytest.mark.parametrize(
    ("pattern", "t0", "t1", "mean"),
    [
        (
            {"pattern": "square", "first": 90, "rest": 30, "period_s": 2.0, "duty": 0.8},
            1.0,
            2.0,
            66.0,
        ),
        (
            {"pattern": "square", "first": 90, "rest": 30, "period_s": 2.0, "duty": 0.8},
            0.0,
            4.0,
            78.0,
        ),
        ({"pattern": "ramp", "start": 10, "per_s": 4}, 1.0, 3.0, 18.0),
        ({"pattern": "sine", "min": 0, "max": 10, "period_s": 4.0}, 0.0, 4.0, 5.0),
        ({"pattern": "trace", "values": [10, 20, 60]}, 0.5, 2.5, 27.5),  # per cycle (1 s)
        ({"pattern": "trace", "per": "second", "step_s": 0.5, "values": [0, 8]}, 0.25, 0.75, 4.0),
    ],
)
def test_interval_means_are_exact(pattern, t0, t1, mean):
    from pydantic import TypeAdapter

    from nvmlsim.gpmstore import interval_mean
    from nvmlsim.model.values import Pattern
    from nvmlsim.world import Timeline

    value = TypeAdapter(Pattern).validate_python(pattern)
    start = 1_767_225_600_000_000
    timeline = Timeline(start, 1_000_000, start - 10**9)
    got = interval_mean(value, start + round(t0 * 1e6), start + round(t1 * 1e6), timeline)
    assert got == pytest.approx(mean, abs=1e-9)
