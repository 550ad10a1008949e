"""Reading and writing the caller's C memory from inside a simulated NVML function.

Callbacks receive pointer arguments as plain integer addresses (``c_void_p``); these helpers
write values with the exact C widths nvidia-ml-py's ctypes structs expect (x86-64 / aarch64
Linux: ``c_ulong`` is 8 bytes), and pack record arrays with ``struct`` for speed.
"""

from __future__ import annotations

import ctypes
import struct

from nvmlsim import codes

__all__ = [
    "put_u16",
    "put_u32",
    "put_i32",
    "put_u64",
    "get_u32",
    "get_u64",
    "put_pointer",
    "get_pointer",
    "put_string",
    "view",
    "RECORD_V1",
    "RECORD_V2",
    "RECORD_V3_32",
    "RECORD_DETAIL",
    "PROC_UTIL_SAMPLE",
    "PROC_UTIL_INFO",
    "SAMPLE_TS",
    "NOT_AVAILABLE_U64",
]

#: ``NVML_VALUE_NOT_AVAILABLE`` for unsigned long long fields (2**64 - 1).
NOT_AVAILABLE_U64 = 0xFFFFFFFFFFFFFFFF

# Process records: pid u32 (+4 pad), usedGpuMemory u64, [gpuInstanceId u32, computeInstanceId
# u32, [usedGpuCcProtectedMemory u64]] -- 16, 24 and 32 bytes (nvml.h nvmlProcessInfo_v1/_v2/_t).
RECORD_V1 = struct.Struct("<I4xQ")
RECORD_V2 = struct.Struct("<I4xQII")
RECORD_V3_32 = struct.Struct("<I4xQIIQ")
RECORD_DETAIL = RECORD_V3_32  # c_nvmlProcessDetail_v1_t has the same 32-byte layout
# c_nvmlProcessUtilizationSample_t: pid u32 (+4), timeStamp u64, sm, mem, enc, dec u32.
PROC_UTIL_SAMPLE = struct.Struct("<I4xQIIII")
# c_nvmlProcessUtilizationInfo_v1_t: timeStamp u64, pid, sm, mem, enc, dec, jpg, ofa u32.
PROC_UTIL_INFO = struct.Struct("<QIIIIIII4x")  # padded to 40 bytes (8-byte alignment)
# c_nvmlSample_t: timeStamp u64 followed by the 8-byte c_nvmlValue_t union.
SAMPLE_TS = struct.Struct("<Q")


def put_u16(addr: int, value: int) -> None:
    """Store ``value`` as an unsigned 16-bit integer at ``addr``."""
    ctypes.c_uint16.from_address(addr).value = value


def put_u32(addr: int, value: int) -> None:
    """Store ``value`` as an unsigned 32-bit integer at ``addr``."""
    ctypes.c_uint32.from_address(addr).value = value


def put_i32(addr: int, value: int) -> None:
    """Store ``value`` as a signed 32-bit integer at ``addr``."""
    ctypes.c_int32.from_address(addr).value = value


def put_u64(addr: int, value: int) -> None:
    """Store ``value`` as an unsigned 64-bit integer at ``addr``."""
    ctypes.c_uint64.from_address(addr).value = value


def get_u32(addr: int) -> int:
    """Load an unsigned 32-bit integer from ``addr``."""
    return ctypes.c_uint32.from_address(addr).value


def get_u64(addr: int) -> int:
    """Load an unsigned 64-bit integer from ``addr``."""
    return ctypes.c_uint64.from_address(addr).value


def put_pointer(addr: int, value: int) -> None:
    """Store a pointer (e.g. a device handle) at ``addr``."""
    ctypes.c_void_p.from_address(addr).value = value


def get_pointer(addr: int) -> int | None:
    """Load a pointer from ``addr`` (None for NULL)."""
    return ctypes.c_void_p.from_address(addr).value


def put_string(addr: int | None, length: int, value: bytes, truncate: bool = False) -> int:
    """Copy ``value`` plus a NUL into the caller's ``length``-byte buffer at ``addr``.

    Returns ``SUCCESS``, ``INVALID_ARGUMENT`` for a NULL buffer, or ``INSUFFICIENT_SIZE`` when
    it does not fit (unless ``truncate``, as ``nvmlSystemGetProcessName`` does).
    """
    if not addr:
        return codes.INVALID_ARGUMENT
    if len(value) + 1 > length:
        if not truncate or length == 0:
            return codes.INSUFFICIENT_SIZE
        value = value[: length - 1]
    ctypes.memmove(addr, value + b"\0", len(value) + 1)
    return codes.SUCCESS


def view(addr: int, nbytes: int) -> ctypes.Array[ctypes.c_char]:
    """Return a writable view of ``nbytes`` of caller memory for ``struct.pack_into``."""
    return (ctypes.c_char * nbytes).from_address(addr)
