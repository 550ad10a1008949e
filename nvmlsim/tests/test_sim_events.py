"""Event sets through the real pynvml: registration, delivery, timeouts, GPU lost, MIG, storms."""

from __future__ import annotations

import copy
import threading
from typing import Any

import pynvml
import pytest

import nvmlsim as sim
from nvmlsim.eventtypes import EVENT_TYPE_BITS, event_type_names

from .sim_helpers import MIG_DEVICE, MIG_UUID, UUID0, UUID1, h0, handle_value

XID = pynvml.nvmlEventTypeXidCriticalError
DBE = pynvml.nvmlEventTypeDoubleBitEccError
FAULTS = ["xid", "double_bit_ecc", "single_bit_ecc"]


def two_gpus(**top: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "devices": [
            {"uuid": UUID0, "supported_events": FAULTS},
            {"uuid": UUID1, "supported_events": ["xid"]},
        ]
    }
    data.update(top)
    return data


def wait_code(es: Any, timeout_ms: int = 0) -> int:
    with pytest.raises(pynvml.NVMLError) as info:
        pynvml.nvmlEventSetWait_v2(es, timeout_ms)
    return int(info.value.value)


BINDING_NAMES = {
    "single_bit_ecc": "nvmlEventTypeSingleBitEccError",
    "double_bit_ecc": "nvmlEventTypeDoubleBitEccError",
    "pstate": "nvmlEventTypePState",
    "xid": "nvmlEventTypeXidCriticalError",
    "clock": "nvmlEventTypeClock",
    "power_source_change": "nvmlEventTypePowerSourceChange",
    "mig_config_change": "nvmlEventMigConfigChange",
    "single_bit_ecc_storm": "nvmlEventTypeSingleBitEccErrorStorm",
    "dram_retirement": "nvmlEventTypeDramRetirementEvent",
    "dram_retirement_failure": "nvmlEventTypeDramRetirementFailure",
    "non_fatal_poison": "nvmlEventTypeNonFatalPoisonError",
    "fatal_poison": "nvmlEventTypeFatalPoisonError",
    "gpu_unavailable": "nvmlEventTypeGpuUnavailableError",
    "gpu_recovery_action": "nvmlEventTypeGpuRecoveryAction",
}


def test_bits_match_the_binding():
    assert {n: getattr(pynvml, b) for n, b in BINDING_NAMES.items()} == EVENT_TYPE_BITS
    assert sum(EVENT_TYPE_BITS.values()) == pynvml.nvmlEventTypeAll
    assert event_type_names(XID | DBE) == ["double_bit_ecc", "xid"]


def test_supported_types_and_registration_rules(simulate):
    simulate(two_gpus(devices=[{"uuid": UUID0, "supported_events": FAULTS}, {"uuid": UUID1}]))
    h = h0()
    assert pynvml.nvmlDeviceGetSupportedEventTypes(h) == 0x1 | 0x2 | 0x8
    h1 = pynvml.nvmlDeviceGetHandleByIndex(1)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetSupportedEventTypes(h1)
    es = pynvml.nvmlEventSetCreate()
    with pytest.raises(pynvml.NVMLError_NotSupported):  # one unsupported type refuses the lot
        pynvml.nvmlDeviceRegisterEvents(h, XID | pynvml.nvmlEventTypePState, es)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceRegisterEvents(h1, XID, es)
    pynvml.nvmlDeviceRegisterEvents(h, XID, es)
    pynvml.nvmlEventSetFree(es)


def test_only_registered_devices_and_types_get_events(simulate):
    drv = simulate(two_gpus())
    assert drv.emit_event(0, "xid", 13) == 0  # no set yet: lost, as on hardware
    es = pynvml.nvmlEventSetCreate()
    pynvml.nvmlDeviceRegisterEvents(h0(), XID, es)
    assert drv.emit_event(0, "double_bit_ecc") == 0  # type not registered
    assert drv.emit_event(1, "xid", 31) == 0  # device not registered
    assert drv.emit_event(0, "xid", 48) == 1
    pynvml.nvmlDeviceRegisterEvents(h0(), DBE, es)  # adds the type
    assert drv.emit_event(0, "double_bit_ecc") == 1
    first = pynvml.nvmlEventSetWait_v2(es, 0)
    second = pynvml.nvmlEventSetWait_v2(es, 0)
    assert (first.eventType, first.eventData) == (XID, 48)
    assert (second.eventType, second.eventData) == (DBE, 0)
    assert handle_value(first.device) == handle_value(h0())
    assert (first.gpuInstanceId, first.computeInstanceId) == (0xFFFFFFFF, 0xFFFFFFFF)
    assert wait_code(es) == pynvml.NVML_ERROR_TIMEOUT
    pynvml.nvmlEventSetFree(es)


def test_every_set_gets_its_own_copy(simulate):
    drv = simulate(two_gpus())
    sets = [pynvml.nvmlEventSetCreate() for _ in range(2)]
    for es in sets:
        pynvml.nvmlDeviceRegisterEvents(h0(), XID, es)
    assert drv.emit_event(UUID0, "xid", 79) == 2
    for es in sets:
        assert pynvml.nvmlEventSetWait_v2(es, 0).eventData == 79
        pynvml.nvmlEventSetFree(es)


def test_scheduled_and_registration_anchored_events(simulate):
    drv = simulate(
        two_gpus(
            nvml_events=[
                {"device": 0, "type": "xid", "data": 43, "at_cycle": 3},
                {"device": 0, "type": "xid", "data": 94, "after_registration": 1, "count": 3},
                {"device": 0, "type": "xid", "data": 95, "after_registration": 2, "delay_s": 1.5},
            ]
        )
    )
    es = pynvml.nvmlEventSetCreate()
    pynvml.nvmlDeviceRegisterEvents(h0(), XID, es)
    assert [pynvml.nvmlEventSetWait_v2(es, 0).eventData for _ in range(3)] == [94, 94, 94]
    assert wait_code(es) == pynvml.NVML_ERROR_TIMEOUT
    drv.next_cycle(2)
    assert pynvml.nvmlEventSetWait_v2(es, 0).eventData == 43
    pynvml.nvmlDeviceRegisterEvents(h0(), XID, es)  # second registration: 95 in 1.5 s
    assert wait_code(es) == pynvml.NVML_ERROR_TIMEOUT
    drv.advance(1.5)
    assert pynvml.nvmlEventSetWait_v2(es, 0).eventData == 95
    pynvml.nvmlEventSetFree(es)


def test_a_waiting_call_wakes_when_the_manual_clock_moves(simulate):
    drv = simulate(two_gpus(nvml_events=[{"device": 1, "type": "xid", "data": 8, "at_s": 5}]))
    es = pynvml.nvmlEventSetCreate()
    pynvml.nvmlDeviceRegisterEvents(pynvml.nvmlDeviceGetHandleByIndex(1), XID, es)
    got: list[int] = []
    waiter = threading.Thread(
        target=lambda: got.append(pynvml.nvmlEventSetWait_v2(es, 30_000).eventData)
    )
    waiter.start()
    assert drv.wait_until_in_flight(1)
    drv.advance(5)
    waiter.join(30)
    assert not waiter.is_alive() and got == [8]
    pynvml.nvmlEventSetFree(es)


def test_emitting_wakes_a_waiting_call(simulate):
    drv = simulate(two_gpus())
    es = pynvml.nvmlEventSetCreate()
    pynvml.nvmlDeviceRegisterEvents(h0(), DBE, es)
    got: list[int] = []
    waiter = threading.Thread(
        target=lambda: got.append(pynvml.nvmlEventSetWait_v2(es, 30_000).eventType)
    )
    waiter.start()
    assert drv.wait_until_in_flight(1)
    assert drv.emit_event(0, "double_bit_ecc") == 1
    waiter.join(30)
    assert got == [DBE]
    pynvml.nvmlEventSetFree(es)


def test_gpu_lost_during_the_wait_then_back_with_a_new_handle(simulate):
    drv = simulate(two_gpus())
    es = pynvml.nvmlEventSetCreate()
    old = h0()
    pynvml.nvmlDeviceRegisterEvents(old, XID, es)
    drv.emit_event(0, "xid", 13)
    drv.trigger("lose_gpu", device=0)
    assert pynvml.nvmlEventSetWait_v2(es, 0).eventData == 13  # queued before the loss
    assert wait_code(es) == pynvml.NVML_ERROR_GPU_IS_LOST
    assert wait_code(es) == pynvml.NVML_ERROR_GPU_IS_LOST  # until the set changes
    assert drv.emit_event(0, "xid", 79) == 0  # a lost GPU raises nothing
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        pynvml.nvmlDeviceRegisterEvents(old, XID, es)
    drv.trigger("restore_gpu", device=0)
    assert wait_code(es) == pynvml.NVML_ERROR_TIMEOUT  # the reset ended the old registration
    assert drv.emit_event(0, "xid", 31) == 0
    fresh = h0()
    assert handle_value(fresh) != handle_value(old)
    pynvml.nvmlDeviceRegisterEvents(fresh, XID, es)
    assert drv.emit_event(0, "xid", 31) == 1
    assert pynvml.nvmlEventSetWait_v2(es, 0).eventData == 31
    pynvml.nvmlEventSetFree(es)


def test_mig_instance_events_need_privileges(simulate):
    unprivileged = copy.deepcopy(MIG_DEVICE) | {"supported_events": ["xid"]}
    privileged = copy.deepcopy(unprivileged)
    privileged["mig"]["privileged"] = True
    for device, reached in ((unprivileged, 0), (privileged, 1)):
        drv = simulate({"devices": [device]})
        h = h0()
        es = pynvml.nvmlEventSetCreate()
        mig = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(h, 0)
        with pytest.raises(pynvml.NVMLError_NotSupported):  # no per-instance registration
            pynvml.nvmlDeviceRegisterEvents(mig, XID, es)
        pynvml.nvmlDeviceRegisterEvents(h, XID, es)
        assert drv.emit_event(MIG_UUID, "xid", 43) == reached
        assert drv.emit_event(UUID1, "xid", 48) == 1  # the whole GPU's events always arrive
        if reached:
            e = pynvml.nvmlEventSetWait_v2(es, 0)
            assert (e.eventData, e.gpuInstanceId, e.computeInstanceId) == (43, 1, 0)
        e = pynvml.nvmlEventSetWait_v2(es, 0)
        assert (e.eventData, e.gpuInstanceId) == (48, 0xFFFFFFFF)
        pynvml.nvmlEventSetFree(es)
        pynvml.nvmlShutdown()
        sim.uninstall()


def test_a_storm_is_delivered_event_by_event(simulate):
    drv = simulate(two_gpus())
    es = pynvml.nvmlEventSetCreate()
    pynvml.nvmlDeviceRegisterEvents(h0(), XID, es)
    drv.emit_event(0, "xid", 13, count=10_000)
    seen = 0
    while True:
        try:
            assert pynvml.nvmlEventSetWait_v2(es, 0).eventData == 13
        except pynvml.NVMLError_Timeout:
            break
        seen += 1
    assert seen == 10_000
    assert drv.call_count("nvmlEventSetWait_v2") == 10_001
    pynvml.nvmlEventSetFree(es)


def test_freed_and_unknown_sets_are_violations(simulate):
    drv = simulate(two_gpus())
    es = pynvml.nvmlEventSetCreate()
    pynvml.nvmlEventSetFree(es)
    assert wait_code(es) == pynvml.NVML_ERROR_INVALID_ARGUMENT
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlEventSetFree(es)
    assert [v.kind for v in drv.violations] == ["invalid_event_set", "invalid_event_set"]


def test_strict_shutdown_with_an_open_set_is_a_violation(simulate):
    drv = simulate(two_gpus(driver={"strict": True}))
    es = pynvml.nvmlEventSetCreate()
    pynvml.nvmlShutdown()
    assert [v.kind for v in drv.violations] == ["event_set_not_freed"]
    pynvml.nvmlInit()
    assert wait_code(es) == pynvml.NVML_ERROR_INVALID_ARGUMENT  # nothing survives shutdown


def test_last_shutdown_ends_a_waiting_call(simulate):
    simulate(two_gpus())
    es = pynvml.nvmlEventSetCreate()
    pynvml.nvmlDeviceRegisterEvents(h0(), XID, es)
    codes: list[int] = []

    def wait() -> None:
        try:
            pynvml.nvmlEventSetWait_v2(es, 30_000)
        except pynvml.NVMLError as e:
            codes.append(int(e.value))

    waiter = threading.Thread(target=wait)
    waiter.start()
    drv = sim.installed()
    assert drv is not None and drv.wait_until_in_flight(1)
    pynvml.nvmlShutdown()
    waiter.join(30)
    assert codes == [pynvml.NVML_ERROR_UNINITIALIZED]


def test_old_drivers_lack_the_v2_wait(simulate):
    device = {"uuid": UUID0, "supported_events": ["xid"]}
    simulate({"driver": {"profile": "440"}, "devices": [device]})
    es = pynvml.nvmlEventSetCreate()
    with pytest.raises(pynvml.NVMLError_FunctionNotFound):
        pynvml.nvmlEventSetWait_v2(es, 0)
    pynvml.nvmlEventSetFree(es)


@pytest.mark.parametrize(
    ("event", "message"),
    [
        ({"device": 0, "type": "xidd", "at_s": 1}, "unknown NVML event type 'xidd'"),
        ({"device": 0, "type": "xid", "at_s": 1, "at_cycle": 2}, "exactly one of at_cycle"),
        ({"device": 0, "type": "xid", "at_s": 1, "delay_s": 2}, "delay_s: only with"),
        ({"device": 5, "type": "xid", "at_s": 1}, "nvml_events[0].device: no device"),
        ({"device": 1, "type": "double_bit_ecc", "at_s": 1}, "not in the GPU's supported_events"),
    ],
)
def test_bad_nvml_events_name_the_field(event, message):
    with pytest.raises(sim.ScenarioError) as info:
        sim.scenario_from_data(two_gpus(nvml_events=[event]))
    assert message in str(info.value)
    assert "nvml_events[0]" in str(info.value)


def test_unknown_supported_event_type_names_the_field():
    with pytest.raises(sim.ScenarioError) as info:
        sim.scenario_from_data({"devices": [{"uuid": UUID0, "supported_events": ["xid", "boom"]}]})
    assert "devices[0].supported_events" in str(info.value)
    assert "unknown NVML event type 'boom'" in str(info.value)


def test_a_registration_answering_unknown_leaves_the_set_undefined(simulate):
    """nvml.h (nvmlDeviceRegisterEvents): "If function reports NVML_ERROR_UNKNOWN, event set
    is in undefined state and should be freed". Before, the set stayed usable."""
    fault = {"function": "nvmlDeviceRegisterEvents", "device": 1, "code": "UNKNOWN", "calls": 1}
    drv = simulate(two_gpus(faults=[fault]))
    es = pynvml.nvmlEventSetCreate()
    pynvml.nvmlDeviceRegisterEvents(h0(), XID, es)
    with pytest.raises(pynvml.NVMLError_Unknown):
        pynvml.nvmlDeviceRegisterEvents(pynvml.nvmlDeviceGetHandleByIndex(1), XID, es)
    assert drv.violations == []
    assert wait_code(es) == pynvml.NVML_ERROR_UNKNOWN  # using it is undefined behaviour
    with pytest.raises(pynvml.NVMLError_Unknown):
        pynvml.nvmlDeviceRegisterEvents(h0(), DBE, es)
    assert [v.kind for v in drv.violations] == ["undefined_event_set"] * 2
    pynvml.nvmlEventSetFree(es)  # the one right thing to do with it
    fresh = pynvml.nvmlEventSetCreate()  # a new set registers both (the fault was used up)
    for index in (0, 1):
        pynvml.nvmlDeviceRegisterEvents(pynvml.nvmlDeviceGetHandleByIndex(index), XID, fresh)
    assert drv.emit_event(1, "xid", 31) == 1
    assert pynvml.nvmlEventSetWait_v2(fresh, 0).eventData == 31
    pynvml.nvmlEventSetFree(fresh)
    assert len(drv.violations) == 2


def test_a_driver_reload_is_uninitialized_until_shutdown_and_init(simulate):
    """Issue 28 item 9: after the kernel module is reloaded under a running process, NVML
    answers UNINITIALIZED until nvmlShutdown + nvmlInit; sets and handles from before are gone,
    and the energy counter restarts ("since the driver was last reloaded")."""
    device = {"uuid": UUID0, "supported_events": ["xid"], "energy_mj": 5_000, "temperature_c": 40}
    drv = simulate({"devices": [device], "driver": {"strict": True}})
    old = h0()
    es = pynvml.nvmlEventSetCreate()
    pynvml.nvmlDeviceRegisterEvents(old, XID, es)
    assert pynvml.nvmlDeviceGetTotalEnergyConsumption(old) == 5_000
    drv.trigger("reload_driver")
    uninitialized = (
        lambda: pynvml.nvmlDeviceGetTemperature(old, 0),
        pynvml.nvmlDeviceGetCount,
        lambda: pynvml.nvmlEventSetWait_v2(es, 0),
        lambda: pynvml.nvmlEventSetFree(es),
    )
    for call in uninitialized:
        with pytest.raises(pynvml.NVMLError_Uninitialized):
            call()
    pynvml.nvmlInit()  # a second reference to the dead session does not revive it
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        pynvml.nvmlDeviceGetCount()
    pynvml.nvmlShutdown()
    pynvml.nvmlShutdown()  # the reference count is back to 0
    pynvml.nvmlInit()
    new = h0()
    assert pynvml.nvmlDeviceGetTemperature(new, 0) == 40
    assert pynvml.nvmlDeviceGetTotalEnergyConsumption(new) == 0  # restarted with the module
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlDeviceGetTemperature(old, 0)  # driver.stale_handle_code
    assert drv.violations == []  # the sets died with the old module: none left unfreed
    assert wait_code(es) == pynvml.NVML_ERROR_INVALID_ARGUMENT  # a set from before the reload
    assert [v.kind for v in drv.violations] == ["invalid_event_set"]


def test_reload_driver_is_a_scenario_event():
    scn = sim.scenario_from_data(two_gpus(events=[{"at_cycle": 3, "action": "reload_driver"}]))
    assert scn.events[0].action == "reload_driver"
