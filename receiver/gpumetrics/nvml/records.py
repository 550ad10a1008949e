"""Multi-record NVML calls in one C call per read, decoded from the records' bytes.

Process lists, per-process utilisation and sample buffers are NVML's two-call functions: a
call with a NULL buffer returns the number of records, a second call fills a buffer of that
size. nvidia-ml-py's wrappers make both calls on every read and return one ctypes structure
per record, whose fields are then read one Python attribute at a time through the binding's
structure wrappers (about half a microsecond each, six to ten per record).

NVML documents that the data call alone suffices when the caller's buffer is large enough
(NVML API reference): for the process lists, ``infoCount`` is the "reference in which to
provide the infos array size, and to return the number of returned elements", and
INSUFFICIENT_SIZE means "infoCount indicates that the infos array is too small" and returns
the size needed; per-process utilisation (``nvmlDeviceGetProcessUtilization``,
``nvmlDeviceGetProcessesUtilizationInfo``) works the same way with ``processSamplesCount``;
``nvmlDeviceGetSamples`` "fetches the number of entries which can be accommodated in the
provided samples array, and the reference samplesCount is updated to indicate how many samples
were actually retrieved".

So each device keeps one buffer per call (:class:`Buffers`), and:

- **process lists** and **sample buffers**: a device's first read makes the binding's two
  calls (the sizing call, then the data call), later reads the data call alone into the kept
  buffer. When that answer does not fit, the same read falls back to the two calls with a
  larger buffer: on INSUFFICIENT_SIZE (the list or the samples grew), and for
  ``nvmlDeviceGetSamples`` when the buffer came back full, since NVML does not say which
  samples a full buffer leaves out. Lists get the binding's own margin (``2n + 5``), sample
  buffers the same. A process list found empty keeps no buffer, so it costs its one sizing
  call, as before;
- **per-process utilisation** keeps the binding's two calls on every read (the sizing call
  sees how many processes have a sample newer than the cursor, the data call fills a buffer of
  exactly that size, as nvidia-ml-py allocates it); only the decoding is done here.

Buffers only grow (a few KiB per device at most: 16-40 bytes per record). Records are unpacked
with ``struct`` in the layouts of the binding's own ctypes structures (:func:`layout`:
``c_nvmlProcessInfo_v2_t``, 24 bytes, which nvidia-ml-py allocates for the ``_v2`` and ``_v3``
symbols; ``c_nvmlProcessUtilizationSample_t``, 32; ``c_nvmlProcessUtilizationInfo_v1_t``, 40),
and ``nvmlSample_t`` (16 bytes: a timestamp and an ``nvmlValue_t`` read through the member its
value type names, never as 64 bits: F24). Errors are raised as the binding raises them
(``pynvml.NVMLError`` for the return code), so :mod:`gpumetrics.nvml.query` classifies them
unchanged.
"""

from __future__ import annotations

import ctypes
import struct
from array import array
from typing import Any

import pynvml

__all__ = [
    "Buffers",
    "accounting_pids",
    "FIELD_VALUE",
    "PROCESS_V2",
    "field_values",
    "layout",
    "process_utilization",
    "processes_utilization_info",
    "running_processes",
    "samples",
]

_SUCCESS = pynvml.NVML_SUCCESS
_INSUFFICIENT = pynvml.NVML_ERROR_INSUFFICIENT_SIZE

_CODES: dict[Any, str] = {
    ctypes.c_uint: "I",
    ctypes.c_int: "i",
    ctypes.c_ulonglong: "Q",
    ctypes.c_longlong: "q",
    ctypes.c_ushort: "H",
    ctypes.c_double: "d",
}


def layout(structure: type[ctypes.Structure]) -> struct.Struct:
    """Return the ``struct`` layout of a ctypes structure of plain numeric fields.

    Field order, offsets, padding and size are those ctypes gives the structure, so records
    are read from a buffer exactly as the structure's own fields would read them.

    Raises:
        TypeError: a field that is not a plain number (an array, a union, a pointer).

    """
    fmt, at = ["<"], 0
    for name, kind in structure._fields_:  # type: ignore[misc]
        code = _CODES.get(kind)
        if code is None:
            raise TypeError(f"{structure.__name__}.{name}: not a plain number field")
        offset = getattr(structure, name).offset
        fmt.append(f"{offset - at}x" if offset > at else "")
        fmt.append(code)
        at = offset + ctypes.sizeof(kind)
    size = ctypes.sizeof(structure)
    fmt.append(f"{size - at}x" if size > at else "")
    return struct.Struct("".join(fmt))


PROCESS_V2 = layout(pynvml.c_nvmlProcessInfo_v2_t)
"""``nvmlProcessInfo_v2_t``: pid, usedGpuMemory, gpuInstanceId, computeInstanceId (24 bytes)."""
_PROCESS_SAMPLE = layout(pynvml.c_nvmlProcessUtilizationSample_t)
"""``nvmlProcessUtilizationSample_t``: pid, timeStamp, smUtil, memUtil, encUtil, decUtil."""
_PROCESS_INFO = layout(pynvml.c_nvmlProcessUtilizationInfo_v1_t)
"""``nvmlProcessUtilizationInfo_v1_t``: timeStamp, pid, sm, mem, enc, dec, jpg, ofa util."""
_SAMPLE_SIZE = 16
_SAMPLE_BY_TYPE: dict[int, struct.Struct] = {
    pynvml.NVML_VALUE_TYPE_DOUBLE: struct.Struct("<Qd"),
    pynvml.NVML_VALUE_TYPE_UNSIGNED_INT: struct.Struct("<QI4x"),
    pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG: struct.Struct("<QQ"),
    pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG: struct.Struct("<QQ"),
    pynvml.NVML_VALUE_TYPE_SIGNED_LONG_LONG: struct.Struct("<Qq"),
    pynvml.NVML_VALUE_TYPE_SIGNED_INT: struct.Struct("<Qi4x"),
    pynvml.NVML_VALUE_TYPE_UNSIGNED_SHORT: struct.Struct("<QH6x"),
}
"""``nvmlSample_t`` per value type: the timestamp and the union member the type names."""
_SAMPLE_TIME = struct.Struct("<Q8x")
_VALUE_BY_TYPE: dict[int, struct.Struct] = {
    t: struct.Struct("<" + layout.format[2:]) for t, layout in _SAMPLE_BY_TYPE.items()
}
"""``nvmlValue_t`` (8 bytes) per value type: the union member the type names."""

FIELD_VALUE = struct.Struct("<IIqqII8s")
"""``nvmlFieldValue_t`` (40 bytes): fieldId, scopeId, timestamp, latencyUsec, valueType,
nvmlReturn, value (``c_nvmlFieldValue_t``'s layout; a test checks it against the binding)."""

_INFO_VERSION = int(getattr(pynvml, "ProcessesUtilizationInfo_v1", 0x01000018))


class _UtilizationInfo(ctypes.Structure):
    """``nvmlProcessesUtilizationInfo_v1_t``: the header the array pointer goes in."""

    _fields_ = [
        ("version", ctypes.c_uint),
        ("processSamplesCount", ctypes.c_uint),
        ("lastSeenTimeStamp", ctypes.c_ulonglong),
        ("procUtilArray", ctypes.c_void_p),
    ]


class _Buffer:
    """A growing array of fixed-size records (raw bytes)."""

    __slots__ = ("array", "capacity", "size", "request")

    def __init__(self, size: int) -> None:
        self.size = size
        self.capacity = 0
        self.array: Any = None
        self.request = b""  # field values: the request's ids, written into array per read

    def grow(self, records: int) -> None:
        if records > self.capacity:
            self.array = (ctypes.c_char * (records * self.size))()
            self.capacity = records

    def unpack(self, layout: struct.Struct, count: int) -> list[tuple[Any, ...]]:
        n = min(count, self.capacity)
        if n <= 0:
            return []
        return list(layout.iter_unpack(ctypes.string_at(self.array, n * self.size)))


class Buffers:
    """One device's kept buffers, one per call (and sampling type)."""

    __slots__ = ("_by_key",)

    def __init__(self) -> None:
        self._by_key: dict[Any, _Buffer] = {}

    def get(self, key: Any, size: int) -> _Buffer:
        """Return the buffer for ``key`` (records of ``size`` bytes), empty at first."""
        buf = self._by_key.get(key)
        if buf is None:
            buf = self._by_key[key] = _Buffer(size)
        return buf


def _oversized(n: int) -> int:
    """nvidia-ml-py's own margin for lists that grow between two calls: ``2n + 5``."""
    return n * 2 + 5


def running_processes(
    symbol: str, handle: Any, buffers: Buffers, record: struct.Struct = PROCESS_V2
) -> list[tuple[Any, ...]]:
    """Read one process list: ``[(pid, usedGpuMemory[, gpuInstanceId, computeInstanceId])]``.

    Args:
        symbol: ``nvmlDeviceGet{Compute,Graphics,MPSCompute}RunningProcesses[_v2|_v3]``.
        handle: the device handle.
        buffers: the device's buffers.
        record: the record layout: :data:`PROCESS_V2` (the ``_v2``/``_v3`` symbols), or the
            16-byte v1 layout of the unversioned symbols.

    Returns:
        The records as NVML wrote them (``usedGpuMemory`` may be the not-available value).

    Raises:
        pynvml.NVMLError: any other answer than SUCCESS, INSUFFICIENT_SIZE included when the
            list outgrew the buffer a second time (the caller retries, F20).

    """
    fn = pynvml._nvmlGetFunctionPointer(symbol)
    buf = buffers.get(symbol, record.size)
    count = ctypes.c_uint(buf.capacity)
    if buf.capacity:
        ret = fn(handle, ctypes.byref(count), buf.array)
    else:  # the first read, or the list was empty: size it
        ret = fn(handle, ctypes.byref(count), None)
        if ret == _SUCCESS:
            return []
    if ret == _INSUFFICIENT:
        buf.grow(_oversized(count.value))
        count.value = buf.capacity
        ret = fn(handle, ctypes.byref(count), buf.array)
    if ret != _SUCCESS:
        raise pynvml.NVMLError(ret)
    return buf.unpack(record, count.value)


def processes_utilization_info(
    handle: Any, last_seen: int, buffers: Buffers
) -> list[tuple[int, int, int, int, int, int]]:
    """``nvmlDeviceGetProcessesUtilizationInfo``: ``[(pid, timeStamp, sm, mem, enc, dec)]`` (%).

    Raises:
        pynvml.NVMLError: NOT_FOUND (no sample newer than ``last_seen``), INSUFFICIENT_SIZE
            when the samples outgrew the buffer twice, any other failure; SUCCESS for a
            successful sizing call (nothing to read), as nvidia-ml-py raises it.

    """
    fn = pynvml._nvmlGetFunctionPointer("nvmlDeviceGetProcessesUtilizationInfo")
    buf = buffers.get("nvmlDeviceGetProcessesUtilizationInfo", _PROCESS_INFO.size)
    info = _UtilizationInfo(_INFO_VERSION, 0, last_seen, None)
    ret = fn(handle, ctypes.byref(info))  # the sizing call
    if ret != _INSUFFICIENT:
        raise pynvml.NVMLError(ret)  # SUCCESS too: nothing to read, as the binding raises it
    buf.grow(info.processSamplesCount)
    info.procUtilArray = ctypes.addressof(buf.array)
    ret = fn(handle, ctypes.byref(info))
    if ret != _SUCCESS:
        raise pynvml.NVMLError(ret)
    return [
        (pid, ts, sm, mem, enc, dec)
        for ts, pid, sm, mem, enc, dec, _, _ in buf.unpack(_PROCESS_INFO, info.processSamplesCount)
    ]


def process_utilization(
    handle: Any, last_seen: int, buffers: Buffers
) -> list[tuple[int, int, int, int, int, int]]:
    """``nvmlDeviceGetProcessUtilization``: ``[(pid, timeStamp, sm, mem, enc, dec)]`` (%).

    Raises:
        pynvml.NVMLError: as :func:`processes_utilization_info`.

    """
    fn = pynvml._nvmlGetFunctionPointer("nvmlDeviceGetProcessUtilization")
    buf = buffers.get("nvmlDeviceGetProcessUtilization", _PROCESS_SAMPLE.size)
    count = ctypes.c_uint(0)
    stamp = ctypes.c_ulonglong(last_seen)
    ret = fn(handle, None, ctypes.byref(count), stamp)  # the sizing call
    if ret != _INSUFFICIENT:
        raise pynvml.NVMLError(ret)  # SUCCESS too: nothing to read, as the binding raises it
    buf.grow(count.value)
    ret = fn(handle, buf.array, ctypes.byref(count), stamp)
    if ret != _SUCCESS:
        raise pynvml.NVMLError(ret)
    return buf.unpack(_PROCESS_SAMPLE, count.value)  # type: ignore[return-value]


def samples(
    handle: Any, sampling_type: int, last_seen: int, buffers: Buffers
) -> tuple[int, list[tuple[int, int | float | None]]]:
    """``nvmlDeviceGetSamples``: ``(value type, [(timeStamp, value)])``.

    Values are read through the union member of the value type; for a type ``nvml.h`` does
    not define, every value is None (the timestamps still move the caller's cursor).

    Raises:
        pynvml.NVMLError: any answer other than SUCCESS (NOT_FOUND: no sample newer than
            ``last_seen``).

    """
    fn = pynvml._nvmlGetFunctionPointer("nvmlDeviceGetSamples")
    buf = buffers.get(("nvmlDeviceGetSamples", sampling_type), _SAMPLE_SIZE)
    value_type = ctypes.c_uint(0)
    count = ctypes.c_uint(buf.capacity)
    stype, stamp = ctypes.c_uint(sampling_type), ctypes.c_ulonglong(last_seen)
    ret = _INSUFFICIENT
    if buf.capacity:
        ret = fn(handle, stype, stamp, ctypes.byref(value_type), ctypes.byref(count), buf.array)
        if ret == _SUCCESS and count.value >= buf.capacity:
            ret = _INSUFFICIENT  # full: some samples may be left out; read them all below
    if ret == _INSUFFICIENT:  # the binding's two calls, into a buffer with room to spare
        count.value = 0
        ret = fn(handle, stype, stamp, ctypes.byref(value_type), ctypes.byref(count), None)
        if ret != _SUCCESS:
            raise pynvml.NVMLError(ret)
        buf.grow(_oversized(count.value))
        count.value = buf.capacity
        ret = fn(handle, stype, stamp, ctypes.byref(value_type), ctypes.byref(count), buf.array)
    if ret != _SUCCESS:
        raise pynvml.NVMLError(ret)
    layout = _SAMPLE_BY_TYPE.get(value_type.value)
    if layout is None:
        return value_type.value, [(ts, None) for (ts,) in buf.unpack(_SAMPLE_TIME, count.value)]
    return value_type.value, buf.unpack(layout, count.value)  # type: ignore[return-value]


def field_values(
    handle: Any, fields: list[Any], buffers: Buffers
) -> list[tuple[int, int | float | None]]:
    """``nvmlDeviceGetFieldValues``: ``(nvmlReturn, value)`` per field, in request order.

    One C call into the device's kept ``nvmlFieldValue_t`` array for this field list (the ids
    are written once, copied in with one ``memmove`` per read); answers are unpacked with
    ``struct`` instead of the binding's structure wrappers (a few microseconds per field).

    Args:
        handle: the device handle.
        fields: ``NVML_FI_*`` ids, or ``(id, scopeId)`` pairs (as the binding takes them).
        buffers: the device's buffers.

    Returns:
        For each field: its ``nvmlReturn`` and, on SUCCESS, the value read through the union
        member its ``valueType`` names (None for a type ``nvml.h`` does not define, or a field
        that did not answer SUCCESS).

    Raises:
        pynvml.NVMLError: the call itself failed (a field's own failure is its ``nvmlReturn``).

    """
    key = ("nvmlDeviceGetFieldValues", tuple(fields))
    buf = buffers.get(key, FIELD_VALUE.size)
    n = len(fields)
    if buf.capacity < n:
        buf.grow(n)
        request = bytearray(FIELD_VALUE.size * n)
        for i, f in enumerate(fields):
            fid, scope = f if isinstance(f, tuple) else (f, 0)
            FIELD_VALUE.pack_into(request, i * FIELD_VALUE.size, fid, scope, 0, 0, 0, 0, b"")
        buf.request = bytes(request)
    ctypes.memmove(buf.array, buf.request, len(buf.request))
    fn = pynvml._nvmlGetFunctionPointer("nvmlDeviceGetFieldValues")
    ret = fn(handle, ctypes.c_int32(n), buf.array)
    if ret != _SUCCESS:
        raise pynvml.NVMLError(ret)
    out: list[tuple[int, int | float | None]] = []
    for _, _, _, _, value_type, code, raw in buf.unpack(FIELD_VALUE, n):
        if code != _SUCCESS:
            out.append((code, None))
            continue
        member = _VALUE_BY_TYPE.get(value_type)
        out.append((code, None if member is None else member.unpack(raw)[0]))
    return out


_PID = struct.Struct("<I")


def accounting_pids(handle: Any, buffers: Buffers, capacity: int) -> list[int]:
    """Read ``nvmlDeviceGetAccountingPids`` in one C call: the pids of the accounting buffer.

    nvidia-ml-py's wrapper asks ``nvmlDeviceGetAccountingBufferSize`` before every read; the
    buffer size is a property of the device, so the caller reads it once and passes it as
    ``capacity`` (the most pids the call can return, NVML API reference).

    Raises:
        pynvml.NVMLError: any answer other than SUCCESS.

    """
    fn = pynvml._nvmlGetFunctionPointer("nvmlDeviceGetAccountingPids")
    buf = buffers.get("nvmlDeviceGetAccountingPids", _PID.size)
    buf.grow(max(capacity, 1))
    count = ctypes.c_uint(buf.capacity)
    ret = fn(handle, ctypes.byref(count), buf.array)
    if ret != _SUCCESS:
        raise pynvml.NVMLError(ret)
    n = min(count.value, buf.capacity)
    return list(array("I", ctypes.string_at(buf.array, n * _PID.size))) if n else []
