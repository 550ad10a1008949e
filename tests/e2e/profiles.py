"""OTLP profiles for the end-to-end tests, as OTLP/JSON: the real eBPF profiler's recorded
report turned into one process's profile, and the resources read back from the file exporter.

The JSON is read with the json module, not with Python protobuf classes: the PyPI
opentelemetry-proto package is generated from an older profiles proto than the Collector's
pdata. The Collector's own JSON unmarshaler reads what is sent, and its file exporter wrote the
recording, so both sides speak the same format. In the file exporter's output resource keys and
string values are references into ``dictionary.stringTable`` (``keyStrindex``,
``stringValueStrindex``); plain ``key``/``stringValue`` are accepted on input.
"""

from __future__ import annotations

import base64
import json
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from .harness import REPO

RECORDED = REPO / "collector/exporter/gpumetricsexporter/testdata/ebpf-profiler/profiles.jsonl"
# The recorded process whose profile is reused
# (collector/exporter/gpumetricsexporter/testdata/ebpf-profiler/README.md).
RECORDED_PID = 9542
PROFILES_PATH = "/v1development/profiles"  # the OTLP/HTTP receiver's profiles path

Typed = tuple[str, Any]
"""An attribute value with its OTLP type: ("string", "x"), ("int", 42), ("double", 0.5), ..."""


def profiler_resource(pid: int, env_names: Iterable[str]) -> dict[str, Typed]:
    """The resource the eBPF profiler gives local process ``pid`` (its
    setResourceAttributes): process.pid (int), process.executable.path and .name from
    /proc/<pid>/exe, and process.environment_variable.<NAME> for each of ``env_names`` the
    process has in /proc/<pid>/environ. (No container.id: the test's processes run in none.)"""
    exe = os.readlink(f"/proc/{pid}/exe")
    resource: dict[str, Typed] = {
        "process.pid": ("int", pid),
        "process.executable.path": ("string", exe),
        "process.executable.name": ("string", os.path.basename(exe)),
    }
    environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    values = dict(kv.decode().split("=", 1) for kv in environ if b"=" in kv)
    for name in env_names:
        if name in values:
            resource[f"process.environment_variable.{name}"] = ("string", values[name])
    return resource


def profile_request(resource: Mapping[str, Typed]) -> bytes:
    """An ExportProfilesServiceRequest (OTLP/JSON) holding the recorded profile of
    RECORDED_PID, its samples and dictionary as recorded, on ``resource``."""
    report = json.loads(RECORDED.read_text().splitlines()[0])
    strings = report["dictionary"]["stringTable"]
    kept = [
        rp
        for rp in report["resourceProfiles"]
        if resolve(rp["resource"], strings).get("process.pid") == ("int", RECORDED_PID)
    ]
    assert len(kept) == 1, f"{RECORDED}: no single profile of pid {RECORDED_PID}"
    kept[0]["resource"] = {
        "attributes": [{"key": k, "value": _json_value(v)} for k, v in sorted(resource.items())]
    }
    report["resourceProfiles"] = kept
    return json.dumps(report).encode()


def _json_value(value: Typed) -> dict[str, Any]:
    kind, v = value
    if kind == "int":
        return {"intValue": str(v)}
    return {f"{kind}Value": v}


def resolve(resource: Mapping[str, Any], strings: Sequence[str]) -> dict[str, Typed]:
    """A resource of the OTLP/JSON profiles form as {key: typed value}, references resolved."""
    out: dict[str, Typed] = {}
    for kv in resource.get("attributes", []):
        key = kv.get("key") or strings[kv.get("keyStrindex", 0)]
        out[key] = typed(kv.get("value", {}), strings)
    return out


def typed(value: Mapping[str, Any], strings: Sequence[str] = ()) -> Typed:
    """An OTLP/JSON AnyValue as a typed value (arrays and maps as tuples)."""
    if "stringValueStrindex" in value:
        return ("string", strings[value["stringValueStrindex"]])
    for kind in ("string", "bool", "double", "bytes"):
        if f"{kind}Value" in value:
            return (kind, value[f"{kind}Value"])
    if "intValue" in value:
        return ("int", int(value["intValue"]))
    if "arrayValue" in value:
        return ("array", tuple(typed(v, strings) for v in value["arrayValue"].get("values", [])))
    if "kvlistValue" in value:
        items = value["kvlistValue"].get("values", [])
        return ("kvlist", tuple(sorted((kv["key"], typed(kv["value"], strings)) for kv in items)))
    return ("empty", None)


def exported_profile_resources(path: Path) -> list[dict[str, Typed]]:
    """Every profile resource the file exporter wrote to ``path`` (complete lines), in order."""
    try:
        lines = path.read_text().split("\n")[:-1]
    except FileNotFoundError:
        return []
    found = []
    for line in lines:
        if not line.strip():
            continue
        report = json.loads(line)
        strings = report.get("dictionary", {}).get("stringTable", [])
        for rp in report.get("resourceProfiles", []):
            found.append(resolve(rp.get("resource", {}), strings))
    return found


def typed_proto(value: Any) -> Typed:
    """An opentelemetry.proto AnyValue (from the metrics side) as a typed value, in the same
    form as ``typed`` gives for OTLP/JSON (bytes as their base64 text, as JSON carries them)."""
    kind = value.WhichOneof("value")
    if kind is None:
        return ("empty", None)
    v = getattr(value, kind)
    name = kind.removesuffix("_value")
    if name == "bytes":
        return ("bytes", base64.b64encode(v).decode())
    if name == "array":
        return ("array", tuple(typed_proto(x) for x in v.values))
    if name == "kvlist":
        return ("kvlist", tuple(sorted((kv.key, typed_proto(kv.value)) for kv in v.values)))
    return (name, v)


def side_by_side(
    left: Mapping[str, Typed], right: Mapping[str, Typed], names: tuple[str, str]
) -> str:
    """Both resources, one key per line, with the differences marked."""
    width = max([len(k) for k in {*left, *right}] + [3])
    lines = [f"{'key':<{width}}  {names[0]:<45}  {names[1]}"]
    for key in sorted({*left, *right}):
        a, b = left.get(key), right.get(key)
        mark = "" if a == b else "   <-- differs"
        lines.append(f"{key:<{width}}  {str(a):<45}  {b}{mark}")
    return "\n".join(lines)
