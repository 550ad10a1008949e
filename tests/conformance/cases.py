"""The conformance case files (``tests/testdata/conformance/``): their model, loader and batches.

The step language is described in ``tests/testdata/conformance/README.md``; this module holds
what the Python runner needs to read it: a strict pydantic model per step (a broken file fails
with the file, case, step and field named), the canonical batches, and which cases a runner
without store control (the real sidecar) can run. The Go runners read the same files
(``collector/internal/conformance``).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import grpc
import yaml
from opentelemetry.proto.collector.logs.v1 import logs_service_pb2
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

DATA = Path(__file__).resolve().parents[1] / "testdata" / "conformance"
"""Where the case files are."""

FILES = ("pull.yaml", "logs_pull.yaml", "profiler.yaml")

Service = Literal["pull", "logs", "profiler"]
CONTROLLED = frozenset({"append", "advance", "held"})
"""Steps only a runner that controls the store can run (not the real sidecar)."""

FIRST_COLLECTION_POINTS = 3
"""Data points of the batch a controlling runner stores for ``given: first_collection``."""

_T0 = 1_700_000_000_000_000_000
_CODES = {c.name for c in grpc.StatusCode}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ErrorWant(_Strict):
    """A failed call: its gRPC status code and the start of its message."""

    code: str
    message: str = ""

    @field_validator("code")
    @classmethod
    def _code(cls, value: str) -> str:
        if value not in _CODES:
            raise ValueError(f"{value!r} is not a gRPC status code name")
        return value


class Append(_Strict):
    """``append``: store ``count`` batches of ``points`` items, each ``bytes`` long if given."""

    points: int = Field(ge=0)
    count: int = Field(default=1, ge=1)
    bytes: int | None = None


class Advance(_Strict):
    """``advance``: the stores' clock moves ``seconds``."""

    seconds: float = Field(gt=0)


class Empty(_Strict):
    """A step without arguments (``restart: {}``)."""


class Size(_Strict):
    """``{size_of: [seqs], plus: n}``: the serialized size of these batches, plus n (By)."""

    size_of: list[int]
    plus: int = 0


class PullWant(_Strict):
    """The answer of a metrics ``pull`` (unnamed values: empty, zero, false)."""

    batches: list[int] = []
    more: bool = False
    dropped_data_points: int = 0
    dropped_data_points_total: int = 0
    drop_reasons: list[str] = []
    error: ErrorWant | None = None


class LogsPullWant(_Strict):
    """The answer of a logs ``pull``."""

    batches: list[int] = []
    more: bool = False
    dropped_log_records: int = 0
    dropped_log_records_total: int = 0
    drop_reasons: list[str] = []
    error: ErrorWant | None = None


class EnvVar(_Strict):
    """One environment variable: a string value is its UTF-8 bytes; ``{hex: ...}`` raw bytes."""

    name: str
    value: str | dict[str, str] = ""

    def raw(self) -> bytes:
        """The value's bytes."""
        if isinstance(self.value, str):
            return self.value.encode()
        if set(self.value) != {"hex"}:
            raise ValueError("environment value: a string or {hex: ...}")
        return bytes.fromhex(self.value["hex"])


class Process(_Strict):
    """One ``ProcessDeclaration``."""

    pid: int = 0
    start_time_ticks: int = 0
    environment: list[EnvVar] = []
    resource: dict[str, str | bool | int | float] = {}
    process_context_hex: str = ""


class ExitEntry(_Strict):
    """One ``ProcessExit``."""

    pid: int = 0
    start_time_ticks: int = 0


class Rejection(_Strict):
    """An expected ``Rejection``; ``reason`` is a part of the reason (any non-empty one if "")."""

    index: int
    pid: int
    field: str
    reason: str = ""


class Declare(_Strict):
    """``declare``: one ``DeclareProcesses``."""

    processes: list[Process]
    replace_all: bool = False
    declarer: str | None = None


class DeclareWant(_Strict):
    """The answer of ``declare``."""

    accepted: int = 0
    released: int = 0
    rejected: list[Rejection] = []
    error: ErrorWant | None = None


class Exits(_Strict):
    """``exits``: one ``ReportExits``."""

    exits: list[ExitEntry]


class ExitsWant(_Strict):
    """The answer of ``exits``."""

    released: int = 0
    rejected: list[Rejection] = []
    error: ErrorWant | None = None


class Open(_Strict):
    """``open``: a ``StreamDeclarations`` stream named ``stream``."""

    stream: str
    declarer: str | None = None


class OpenWant(_Strict):
    """``open`` may only expect the stream to fail."""

    error: ErrorWant


class DeclareBatch(_Strict):
    """The ``declare_batch`` event of ``send``."""

    processes: list[Process]


class Send(_Strict):
    """``send``: one event on a stream (none of the event keys: no event set)."""

    stream: str
    declare: Process | None = None
    declare_batch: DeclareBatch | None = None
    exit: ExitEntry | None = None
    resync_begin: Empty | None = None
    resync_end: Empty | None = None


class SendWant(_Strict):
    """The answer to one streamed event (``declared``, ``rejections``: of a ``declare_batch``)."""

    accepted: bool = False
    released: int = 0
    declared: int = 0
    rejection: Rejection | None = None
    rejections: list[Rejection] = []


class Close(_Strict):
    """``close``: end a stream from the client's side."""

    stream: str


_BODY: dict[str, type[BaseModel] | None] = {
    "append": Append,
    "advance": Advance,
    "held": None,  # a list of sequences
    "restart": Empty,
    "pull": None,  # a request, checked against the .proto message by the runner
    "declare": Declare,
    "exits": Exits,
    "open": Open,
    "send": Send,
    "close": Close,
}
_WANT: dict[str, type[BaseModel] | None] = {
    "declare": DeclareWant,
    "exits": ExitsWant,
    "open": OpenWant,
    "send": SendWant,
}
_STEPS_OF: dict[str, frozenset[str]] = {
    "pull": frozenset({"append", "advance", "held", "restart", "pull"}),
    "logs": frozenset({"append", "advance", "held", "restart", "pull"}),
    "profiler": frozenset({"restart", "declare", "exits", "open", "send", "close"}),
}


@dataclass(frozen=True)
class Step:
    """One step: its kind, its parsed body (or raw value) and what it must answer."""

    kind: str
    body: Any
    want: Any


@dataclass(frozen=True)
class Case:
    """One case of a file."""

    file: str
    service: Service
    name: str
    rule: str
    config: Mapping[str, Any]
    given: str | None
    steps: tuple[Step, ...]

    @property
    def id(self) -> str:
        """``file::name``, the pytest id."""
        return f"{self.file}::{self.name}"

    @property
    def controlled(self) -> bool:
        """Whether it needs a runner that controls the store (so not the real sidecar)."""
        return any(s.kind in CONTROLLED for s in self.steps)


class CaseError(ValueError):
    """A case file that does not follow the step language; the message names the place."""


def _step(service: Service, raw: object, where: str) -> Step:
    if not isinstance(raw, dict):
        raise CaseError(f"{where}: a step is a mapping, got {type(raw).__name__}")
    keys = [k for k in raw if k != "want"]
    if len(keys) != 1 or keys[0] not in _STEPS_OF[service]:
        raise CaseError(
            f"{where}: one step key of {sorted(_STEPS_OF[service])} (and 'want'), got {keys}"
        )
    kind = keys[0]
    try:
        model = _BODY[kind]
        body: Any = raw[kind]
        if kind == "held":
            if not isinstance(body, list) or not all(isinstance(s, int) for s in body):
                raise CaseError(f"{where}.held: a list of sequences")
        elif kind == "pull":
            if not isinstance(body, dict):
                raise CaseError(f"{where}.pull: a request mapping")
        elif model is not None:
            body = model.model_validate(body)
        want: Any = raw.get("want")
        if kind == "pull":
            want = (LogsPullWant if service == "logs" else PullWant).model_validate(want)
        elif kind in _WANT:
            want_model = _WANT[kind]
            if want is None and kind == "open":
                want = None
            elif want_model is not None:
                want = want_model.model_validate(want or {})
        elif want is not None:
            raise CaseError(f"{where}: {kind} answers nothing, it takes no 'want'")
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or '(value)'}: {e['msg']}" for e in exc.errors()
        )
        raise CaseError(f"{where}.{kind}: {problems}") from None
    return Step(kind, body, want)


def load(name: str) -> tuple[Case, ...]:
    """Read and check one case file of :data:`DATA`.

    Raises:
        CaseError: naming the file, case and step that do not follow the language.

    """
    path = DATA / name
    data = yaml.safe_load(path.read_text())
    if not isinstance(data, dict) or data.get("format") != 1:
        raise CaseError(f"{name}: 'format: 1' expected")
    service = data.get("service")
    if service not in _STEPS_OF:
        raise CaseError(f"{name}: 'service' must be one of {sorted(_STEPS_OF)}, got {service!r}")
    cases: list[Case] = []
    for i, raw in enumerate(data.get("cases") or ()):
        where = f"{name}: cases[{i}]"
        if not isinstance(raw, dict):
            raise CaseError(f"{where}: a mapping")
        extra = set(raw) - {"name", "rule", "config", "given", "steps"}
        if extra:
            raise CaseError(f"{where}: unknown keys {sorted(extra)}")
        case_name = raw.get("name")
        if not isinstance(case_name, str) or not case_name:
            raise CaseError(f"{where}.name: a non-empty string")
        if any(c.name == case_name for c in cases):
            raise CaseError(f"{where}.name: {case_name!r} is used twice")
        given = raw.get("given")
        if given not in (None, "first_collection") or (given and service == "profiler"):
            raise CaseError(f"{where}.given: only 'first_collection', in pull and logs files")
        steps = tuple(
            _step(service, s, f"{where} ({case_name}).steps[{j}]")
            for j, s in enumerate(raw.get("steps") or ())
        )
        if not steps:
            raise CaseError(f"{where}: no steps")
        cases.append(
            Case(
                name,
                service,
                case_name,
                str(raw.get("rule", "")),
                dict(raw.get("config") or {}),
                given,
                steps,
            )
        )
    return tuple(cases)


def all_cases() -> Iterator[Case]:
    """Every case of every file, in file order."""
    for name in FILES:
        yield from load(name)


def metrics_batch(sequence: int, points: int) -> bytes:
    """The canonical metrics batch (README "Batches"), serialized."""
    req = metrics_service_pb2.ExportMetricsServiceRequest()
    rm = req.resource_metrics.add()
    kv = rm.resource.attributes.add()
    kv.key, kv.value.int_value = "conformance.batch", sequence
    metric = rm.scope_metrics.add().metrics.add()
    metric.name = "conformance.value"
    for i in range(points):
        dp = metric.gauge.data_points.add()
        dp.time_unix_nano, dp.as_int = _T0 + i, i
    return req.SerializeToString()


def logs_batch(sequence: int, records: int) -> bytes:
    """The canonical logs batch (README "Batches"), serialized."""
    req = logs_service_pb2.ExportLogsServiceRequest()
    rl = req.resource_logs.add()
    kv = rl.resource.attributes.add()
    kv.key, kv.value.int_value = "conformance.batch", sequence
    scope = rl.scope_logs.add()
    for i in range(records):
        rec = scope.log_records.add()
        rec.time_unix_nano, rec.event_name, rec.body.int_value = _T0 + i, "conformance.event", i
    return req.SerializeToString()
