import pytest
from gpumetrics.metrics import GPU, CountNVIDIAGPUs
from gpumetrics.selftelemetry import Telemetry


def test_put_attrs_leaves_unknown_fields_out():
    g = GPU(
        uuid="GPU-a", index=0, name="gpu0", model=None, serial_number=None, driver_version="570.1"
    )
    assert g.put_attrs({}) == {
        "hw.id": "GPU-a",
        "hw.name": "gpu0",
        "hw.vendor": "NVIDIA",
        "hw.driver_version": "570.1",
    }


def test_mig_instance_id_attrs_carry_parent():
    mig = GPU(uuid="MIG-x", parent_uuid="GPU-a", gpu_instance_id=1, compute_instance_id=0)
    assert mig.id_attributes() == (("hw.id", "MIG-x"), ("hw.parent", "GPU-a"))


def test_count_gpus_from_procfs(tmp_path):
    assert CountNVIDIAGPUs(str(tmp_path)) == 0
    gpus = tmp_path / "driver" / "nvidia" / "gpus"
    for bus in ("0000:17:00.0", "0000:65:00.0", "0000:ca:00.0"):
        (gpus / bus).mkdir(parents=True)
    assert CountNVIDIAGPUs(str(tmp_path)) == 3


def test_telemetry_rejects_undeclared_and_mistyped_names():
    t = Telemetry()
    with pytest.raises(KeyError, match="not declared"):
        t.add("gpumetrics.bogus")
    with pytest.raises(ValueError, match="gauge"):
        t.add("gpumetrics.devices")
    with pytest.raises(ValueError, match="counter"):
        t.set("gpumetrics.nvml.errors", 1)
    with pytest.raises(ValueError, match="only increase"):
        t.add("gpumetrics.nvml.errors", -1)


def test_replace_removes_series_no_longer_present():
    t = Telemetry()
    t.replace("gpumetrics.devices", {(("hw.state", "ok"),): 2, (("hw.state", "failed"),): 1})
    t.replace("gpumetrics.devices", {(("hw.state", "ok"),): 3})
    assert t.value("gpumetrics.devices", {"hw.state": "ok"}) == 3
    assert t.value("gpumetrics.devices", {"hw.state": "failed"}) is None
    assert t.total("gpumetrics.devices") == 3
