"""``gpumetrics serve --simulate`` as a process: ``gpumetrics pull`` it, stop it with SIGTERM."""

from __future__ import annotations

from grpc_health.v1 import health_pb2

from .served import Served


def test_serve_simulate_then_pull_json_shows_device_metrics_and_sigterm_exits_0(tmp_path):
    served = Served(tmp_path, "default", listen="127.0.0.1:0")
    try:
        assert served.started["identity_mode"] == "profiler"  # the default, logged at start
        assert served.address.startswith("127.0.0.1:")
        served.watch_health([health_pb2.HealthCheckResponse.SERVING])
        request = served.pull()
        devices: set[str] = set()
        names: set[str] = set()
        for rm in request.resource_metrics:
            for sm in rm.scope_metrics:
                for m in sm.metrics:
                    names.add(m.name)
                    if m.name == "hw.gpu.utilization":
                        for dp in m.gauge.data_points:
                            devices.update(
                                kv.value.string_value for kv in dp.attributes if kv.key == "hw.id"
                            )
        assert {"hw.gpu.utilization", "hw.gpu.memory.usage", "hw.power", "hw.energy"} <= names
        assert len(devices) == 8  # the default profile: an 8-GPU training node
        served.stop()  # SIGTERM: exit 0, and logs go to stderr only
    finally:
        served.close()
    logged = served.records
    (driver,) = [r["@message"] for r in logged if r["@message"].startswith("NVML initialised")]
    version = driver.removeprefix("NVML initialised (driver ").removesuffix(")")
    # the start-up summary: once, at INFO, with what NVML said
    ready = [(r["@level"], r["@message"]) for r in logged if r["@message"].startswith("ready")]
    assert ready == [
        (
            "info",
            f"ready: config none; listen {served.address} [pull: no token]; "
            f"profiler_listen unix://{served.profiler_address.removeprefix('unix:')} "
            "[declare: peer credentials]; "
            "TLS off; relabel rules 0; "
            f"NVML simulated (h100-8x-training), driver {version}, 8 GPUs",
        )
    ]
