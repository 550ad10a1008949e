"""Scenario files: broken ones fail fast naming the field; built-ins and F-cases all load."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import nvmlsim as sim
from nvmlsim.model.values import Ramp, Sine, Square, Trace, evaluate

from .sim_helpers import MIG_UUID, UUID0, UUID1, full_scenario, one_gpu


def _problems(data: object) -> dict[str, str]:
    with pytest.raises(sim.ScenarioError) as raised:
        sim.scenario_from_data(data)
    return dict(raised.value.problems)


@pytest.mark.parametrize(
    ("data", "path", "fragment"),
    [
        ({"devices": [{"uuid": UUID0, "bogus": 1}]}, "devices[0].bogus", "Extra inputs"),
        (
            {"devices": [{"uuid": UUID0, "processes": [{"pid": -1}]}]},
            "devices[0].processes[0].pid",
            "greater than or equal to 0",
        ),
        (
            {
                "devices": [
                    {"uuid": UUID0},
                    {"uuid": UUID1, "processes": [{"pid": 5, "name": "a", "name_bytes": "b"}]},
                ]
            },
            "devices[1].processes[0].name_bytes",
            "either name or name_bytes",
        ),
        (
            one_gpu(memory={"total_bytes": 10, "used_bytes": 20}),
            "devices[0].memory.used_bytes",
            "<= total_bytes",
        ),
        (
            one_gpu(utilization={"gpu": {"pattern": "sine", "min": 0, "max": 120, "period_s": 3}}),
            "devices[0].utilization.gpu",
            "within 0..100",
        ),
        (
            one_gpu(power={"usage_mw": {"pattern": "sine", "min": 1}}),
            "devices[0].power.usage_mw.sine.max",
            "Field required",
        ),
        (
            {"devices": [{"uuid": UUID0}, {"uuid": UUID0}]},
            "devices[1].uuid",
            "duplicates devices[0].uuid",
        ),
        ({"devices": [{"uuid": UUID0, "index": 3}]}, "devices", "indices must be 0..0"),
        (
            {"faults": [{"function": "nvmlDeviceGetPowerUsag", "code": "NOT_SUPPORTED"}]},
            "faults[0].function",
            "did you mean 'nvmlDeviceGetPowerUsage'",
        ),
        (
            {"faults": [{"function": "nvmlInit_v2", "code": "NOTSUP"}]},
            "faults[0].code",
            "unknown NVML return code",
        ),
        ({"faults": [{"function": "nvmlInit_v2"}]}, "faults[0]", "at least one of code"),
        (
            {
                "devices": [{"uuid": UUID0}],
                "faults": [{"function": "*", "device": 4, "hang": True}],
            },
            "faults[0].device",
            "no device with index 4",
        ),
        (
            {
                "overrides": [
                    {"function": "nvmlDeviceGetUtilizationRates", "field": "gpuu", "value": 1}
                ]
            },
            "overrides[0].field",
            "unknown field 'gpuu'",
        ),
        (
            {
                "overrides": [
                    {"function": "nvmlDeviceGetUtilizationRates", "field": "gpu", "value": 2**40}
                ]
            },
            "overrides[0].value",
            "does not fit",
        ),
        ({"events": [{"at_cycle": 3, "action": "lose_gpu"}]}, "events[0].device", "required"),
        ({"events": [{"action": "upgrade_driver"}]}, "events[0]", "exactly one of at_cycle"),
        ({"driver": {"profile": "999"}}, "driver.profile", "unknown driver profile '999'"),
        ({"driver": {"missing_symbols": ["nvmlFoo"]}}, "driver.missing_symbols[0]", "unknown"),
        (
            one_gpu(processes=[{"pid": 4, "from_cycle": 3, "until_cycle": 2}]),
            "devices[0].processes[0].until_cycle",
            "must be > from_cycle",
        ),
        (
            one_gpu(processes=[{"pid": 4}, {"pid": 4}]),
            "devices[0].processes[1].pid",
            "duplicates processes[0].pid",
        ),
        (
            one_gpu(
                mig={
                    "current": "enabled",
                    "max_devices": 2,
                    "instances": [
                        {
                            "slot": 2,
                            "gpu_instance_id": 1,
                            "compute_instance_id": 0,
                            "uuid": MIG_UUID,
                        }
                    ],
                }
            ),
            "devices[0].mig.instances[0].slot",
            "must be < mig.max_devices",
        ),
        (
            one_gpu(mig={"current": "enabled"}, processes=[{"pid": 1}]),
            "devices[0].processes",
            "belong under mig.instances",
        ),
        (
            one_gpu(processes=[{"pid": 4, "name_bytes": "caf\u20ac"}]),
            "devices[0].processes[0].name_bytes",
            "U+0000..U+00FF",
        ),
        (
            one_gpu(samples={"gpu_utilization": {"value_type": "FLOAT"}}),
            "devices[0].samples.gpu_utilization.value_type",
            "unknown value type",
        ),
        (
            one_gpu(field_values={"POWER_INSTANT": {"value": 1}, 186: {"value": 2}}),
            "devices[0].field_values",
            "given twice",
        ),
        (
            one_gpu(field_values={"NO_SUCH_FIELD": {"value": 1}}),
            "devices[0].field_values",
            "unknown NVML field id",
        ),
        ([1, 2], "", "the top level must be a mapping"),
        ({"devices": [{"uuid": "nope"}]}, "devices[0].uuid", "'nope' is not an NVML GPU UUID"),
        (
            {"devices": [{"uuid": "GPU-7C1E2A90-3F4B-4D21-8E6A-0B9C5D3E1F70"}]},
            "devices[0].uuid",
            "32 lowercase hex digits as 8-4-4-4-12",
        ),
        ({"devices": [{"uuid": MIG_UUID}]}, "devices[0].uuid", "not an NVML GPU UUID"),
        (
            one_gpu(
                mig={
                    "current": "enabled",
                    "instances": [
                        {"slot": 0, "gpu_instance_id": 1, "compute_instance_id": 0, "uuid": UUID1}
                    ],
                }
            ),
            "devices[0].mig.instances[0].uuid",
            "not an NVML MIG device UUID",
        ),
        (
            one_gpu(
                mig={
                    "current": "enabled",
                    "instances": [
                        {
                            "slot": 0,
                            "gpu_instance_id": 1,
                            "compute_instance_id": 0,
                            "uuid": f"MIG-{UUID1}/1/0",
                        }
                    ],
                }
            ),
            "devices[0].mig.instances[0].uuid",
            f"names GPU {UUID1}, but the instance is on {UUID0}",
        ),
        (
            one_gpu(
                mig={
                    "current": "enabled",
                    "instances": [
                        {
                            "slot": 0,
                            "gpu_instance_id": 1,
                            "compute_instance_id": 0,
                            "uuid": f"MIG-{UUID0}/2/0",
                        }
                    ],
                }
            ),
            "devices[0].mig.instances[0].uuid",
            "names GPU instance 2 / compute instance 0, but the instance has 1 / 0",
        ),
    ],
)
def test_bad_scenario_names_the_field(data, path, fragment):
    problems = _problems(data)
    assert path in problems, problems
    assert fragment in problems[path]


def test_error_message_lists_every_problem_with_source(tmp_path: Path):
    path = tmp_path / "broken.yaml"
    path.write_text(f"devices:\n  - uuid: {UUID0}\n    bogus: 1\n    memory: {{total_bytes: -1}}\n")
    with pytest.raises(sim.ScenarioError) as raised:
        sim.load_scenario(path)
    text = str(raised.value)
    assert str(path) in text
    assert "devices[0].bogus: Extra inputs are not permitted" in text
    assert "devices[0].memory.total_bytes: Input should be greater than or equal to 0" in text


def test_yaml_duplicate_keys_are_rejected(tmp_path: Path):
    path = tmp_path / "dup.yaml"
    path.write_text("driver: {profile: '570'}\ndriver: {profile: '470'}\n")
    with pytest.raises(sim.ScenarioError, match="duplicate key 'driver'"):
        sim.load_scenario(path)


def test_yaml_syntax_error_is_reported(tmp_path: Path):
    path = tmp_path / "bad.yaml"
    path.write_text("devices: [\n")
    with pytest.raises(sim.ScenarioError, match="not valid YAML"):
        sim.load_scenario(path)


def test_missing_file_and_unknown_profile(tmp_path: Path):
    with pytest.raises(sim.ScenarioError, match="cannot read"):
        sim.load_scenario(tmp_path / "nope.yaml")
    with pytest.raises(sim.ScenarioError, match="built-in profiles: a100-mig"):
        sim.load_scenario("no-such-profile")


def test_merge_keys_and_extension_fields(tmp_path: Path):
    path = tmp_path / "anchors.yaml"
    path.write_text(
        "x-gpu: &gpu {name: Shared, temperature_c: 40}\n"
        "devices:\n"
        f"  - {{<<: *gpu, uuid: {UUID0}}}\n"
        f"  - {{<<: *gpu, uuid: {UUID1}, temperature_c: 50}}\n"
    )
    scn = sim.load_scenario(path)
    assert [d.name for d in scn.devices] == ["Shared", "Shared"]
    assert [d.temperature_c for d in scn.devices] == [40, 50]


def test_raw_bytes_from_yaml_escapes(tmp_path: Path):
    path = tmp_path / "names.yaml"
    path.write_text(f'devices:\n  - uuid: {UUID0}\n    name_bytes: "\\xf8\\x01NVIDIA"\n')
    assert sim.load_scenario(path).devices[0].name_bytes == b"\xf8\x01NVIDIA"


def test_builtin_profiles_load_and_default_exists():
    names = sim.list_profiles()
    assert {
        "h100-sxm",
        "h100-8x-training",
        "a100-mig",
        "geforce-rtx-4090",
        "gb10",
        "vgpu-l40-16q",
        "old-driver-v100",
        "jetson-orin",
    } <= set(names)
    assert sim.DEFAULT_PROFILE in names
    for name in names:
        scn = sim.load_scenario(name)
        assert scn.devices, name
        assert scn.name == name
    assert len(sim.load_scenario(sim.DEFAULT_PROFILE).devices) == 8


def test_every_field_case_has_a_loadable_scenario(scenarios_dir: Path):
    files = sorted(scenarios_dir.glob("F*.yaml"))
    cases = {f.name[:3] for f in files}
    assert cases == {f"F{n:02d}" for n in range(1, 33)}
    for f in files:
        scn = sim.load_scenario(f)
        assert scn.name == f.stem
    assert sim.list_field_cases() == [f.stem for f in files]
    by_name = sim.load_scenario("F16_pid_reuse")
    assert by_name == sim.load_scenario(scenarios_dir / "F16_pid_reuse.yaml")


def test_unknown_field_case_names_both_kinds():
    with pytest.raises(sim.ScenarioError, match="no such profile, field case or file"):
        sim.field_case_path("F99_nothing")


def test_json_schema_export_forbids_unknown_keys():
    schema = json.loads(sim.scenario_json_schema())
    assert schema["additionalProperties"] is False
    assert {"driver", "devices", "faults", "overrides", "events"} <= set(schema["properties"])
    assert schema["$defs"]["Device"]["additionalProperties"] is False


def test_scenario_object_passes_through_load():
    scn = sim.scenario_from_data(full_scenario())
    assert sim.load_scenario(scn) is scn


@pytest.mark.parametrize(
    ("pattern", "t", "cycle", "expected"),
    [
        (Sine(pattern="sine", min=0, max=100, period_s=4), 1.0, 1, 100.0),
        (Sine(pattern="sine", min=0, max=100, period_s=4), 3.0, 1, 0.0),
        (Square(pattern="square", first=9, rest=1, period_s=2, duty=0.25), 0.4, 1, 9),
        (Square(pattern="square", first=9, rest=1, period_s=2, duty=0.25), 0.6, 1, 1),
        (Ramp(pattern="ramp", start=10, per_s=2.5), 4.0, 1, 20.0),
        (Trace(pattern="trace", values=[5, 6, 7]), 0.0, 2, 6),
        (Trace(pattern="trace", values=[5, 6, 7]), 0.0, 9, 7),
        (Trace(pattern="trace", values=[5, 6, 7], after="repeat"), 0.0, 5, 6),
        (Trace(pattern="trace", values=[5, 6, 7], per="second", step_s=0.5), 1.2, 1, 7),
    ],
)
def test_patterns_evaluate(pattern, t, cycle, expected):
    assert evaluate(pattern, t, cycle) == pytest.approx(expected)
