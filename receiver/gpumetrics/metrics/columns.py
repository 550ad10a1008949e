"""Columnar point storage: the boundary between collection and OTLP encoding.

A cycle's readings never become one Python object per data point. They land in columns:

- :class:`MetricColumns` holds the points of one metric for one resource as four parallel
  columns: the attribute tuple of each point (a reference to a tuple its reader shares between
  points, never a new object per point), and ``array`` columns of times, values and start times
  (machine numbers, not Python objects). Values are ``array('q')`` for ``value_type: int``
  metrics and ``array('d')`` otherwise, so an int metric cannot hold a float.
- :class:`ProcessBlock` is the per-process table of one metric for one device and cycle: one
  attribute tuple shared by every row (the GPU's identity and, e.g., ``hw.gpu.task``), and
  columns of pids, values, times and start times (a time or start shared by every row is one
  number, not a column).
- :class:`Points` is what one device's tick gathers (device points by metric, process blocks),
  committed to the producer whole or not at all (``Producer.commit``).

**Validation at the table boundary.** ``MetricBuffer.add``'s rules hold for every point that
reaches the encoder: int metrics take ints, values are finite, ratio metrics lie in [0, 1],
times are > 0 and cumulative Sums carry a start time > 0. :func:`check` tests a whole column
with C-level scans (``min``/``max``/``sum`` over arrays); only a column that fails one is
filtered point by point, and every point refused is counted (the collector reports them as
``gpumetrics.values.dropped{reason=invalid_point}``), as ``MetricBuffer.extend`` did. A value
whose type the column cannot hold (a float for an int metric, a bool, an int outside int64) is
refused when it is added.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Iterator, Mapping, Sequence
from itertools import repeat
from typing import Any

from gpumetrics.metrics.buffer import Attributes, Point, UnknownMetricError
from gpumetrics.metrics.spec import MetricSpec, ValueType, catalogue

__all__ = [
    "MetricColumns",
    "ProcessColumns",
    "Points",
    "ProcessBlock",
    "ResourceColumns",
    "check",
    "value_code",
]


_INT = ValueType.INT  # (an enum class attribute costs a lookup through its metaclass)


def value_code(spec: MetricSpec) -> str:
    """Return the ``array`` type code of a metric's values: ``q`` (int64) or ``d`` (double)."""
    return "q" if spec.value_type is _INT else "d"


def _number_ok(value: Any, int_only: bool) -> bool:
    """``MetricBuffer.add``'s type rule for a value that is not exactly ``int`` or ``float``."""
    kind = type(value)
    if kind is bool or not isinstance(value, (int, float)):
        return False
    return isinstance(value, int) or not int_only


class MetricColumns:
    """The points of one metric for one resource, in arrival order.

    Attributes:
        spec: the metric's catalogue spec.
        attributes: each point's attribute tuple (shared tuples; keys unique per tuple).
        times: observation times, ns since the Unix epoch (``array('q')``).
        values: the values in the metric's unit (``array('q')`` or ``array('d')``).
        starts: start times of cumulative series, ns since the Unix epoch, 0 for none.

    """

    __slots__ = ("spec", "attributes", "times", "values", "starts")

    def __init__(self, spec: MetricSpec) -> None:
        self.spec = spec
        self.attributes: list[Attributes] = []
        self.times = array("q")
        self.values = array(value_code(spec))
        self.starts = array("q")

    def __len__(self) -> int:
        return len(self.times)

    def add(self, value: Any, time_unix_nano: int, attributes: Attributes, start: int) -> bool:
        """Append one point; return False (nothing appended) when a column cannot hold it.

        Refused: a bool, a float for an int metric, anything that is not an int or a float
        (subclasses of them excepted), an int outside int64, times that are not int64.
        """
        kind = type(value)
        if (
            kind is not float
            and kind is not int
            and not _number_ok(value, self.values.typecode == "q")
        ):
            return False
        n = len(self.times)
        try:
            self.values.append(value)
            self.times.append(time_unix_nano)
            self.starts.append(start)
        except (TypeError, OverflowError):
            del self.values[n:]
            del self.times[n:]
            del self.starts[n:]
            return False
        self.attributes.append(attributes)
        return True

    def extend(self, other: MetricColumns) -> None:
        """Append every point of ``other`` (a column of the same metric)."""
        self.attributes.extend(other.attributes)
        self.times.extend(other.times)
        self.values.extend(other.values)
        self.starts.extend(other.starts)

    def points(self) -> Iterator[Point]:
        """Yield the points as :class:`Point` tuples (tests and the reference encoder)."""
        for attrs, t, v, s in zip(
            self.attributes, self.times, self.values, self.starts, strict=True
        ):
            yield Point(v, t, attrs, s)


def _rules(spec: MetricSpec) -> tuple[bool, bool]:
    return spec.ratio, spec.instrument.is_sum


def _bad_rows(
    spec: MetricSpec, times: Sequence[int], values: Sequence[Any], starts: Sequence[int]
) -> list[int]:
    """Indexes of the rows that break a rule (the slow path; :func:`check` found one)."""
    ratio, is_sum = _rules(spec)
    bad = []
    for i, (t, v, s) in enumerate(zip(times, values, starts, strict=True)):
        if (
            t <= 0
            or (is_sum and s <= 0)
            or v - v != 0  # NaN or ±inf
            or (ratio and not 0.0 <= v <= 1.0)
        ):
            bad.append(i)
    return bad


def _all_ok(
    spec: MetricSpec, times: Sequence[int], values: Sequence[Any], starts: Sequence[int]
) -> bool:
    """Tell whether every row passes (C-level scans over the columns)."""
    if not times:
        return True
    if min(times) <= 0:
        return False
    ratio, is_sum = _rules(spec)
    if is_sum and min(starts) <= 0:
        return False
    if isinstance(values, array) and values.typecode == "q":
        return not ratio or (min(values) >= 0 and max(values) <= 1)
    total = sum(values)
    if total - total != 0:  # a NaN or an infinity among them (or an overflowing sum: re-checked)
        return not _bad_rows(spec, times, values, starts)
    return not ratio or (min(values) >= 0.0 and max(values) <= 1.0)


def check(columns: MetricColumns) -> int:
    """Drop the points of ``columns`` that break ``MetricBuffer.add``'s rules; return how many.

    Rules (from the spec): finite values, ratios within [0, 1], times > 0, and a start time > 0
    on every point of a cumulative Sum. The value types were enforced when the points were
    added (the columns' type codes).
    """
    if _all_ok(columns.spec, columns.times, columns.values, columns.starts):
        return 0
    bad = _bad_rows(columns.spec, columns.times, columns.values, columns.starts)
    for i in reversed(bad):
        del columns.attributes[i]
        del columns.times[i]
        del columns.values[i]
        del columns.starts[i]
    return len(bad)


class ProcessBlock:
    """One metric's per-process points from one device's tick: a row per process.

    Args:
        spec: the metric's catalogue spec.
        attributes: the attribute tuple every row carries (the device's identity attributes,
            ``hw.gpu.task``...).
        pids: process ids, one per row (positive; validated by the reader).
        values: one value per row in the metric's unit.
        times: one observation time per row (ns since the Unix epoch), or one int for all.
        starts: one start time per row (0: none), or one int for all.

    ``Producer.commit`` checks a block with :meth:`refused` (a positive pid and
    ``MetricBuffer.add``'s rules on every row) and appends it to the batch's
    :class:`ProcessColumns` of its metric in one step.

    """

    __slots__ = ("spec", "attributes", "pids", "values", "times", "starts")

    def __init__(
        self,
        spec: MetricSpec,
        attributes: Attributes,
        pids: Sequence[int],
        values: Sequence[Any],
        times: Sequence[int] | int,
        starts: Sequence[int] | int = 0,
    ) -> None:
        self.spec = spec
        self.attributes = attributes
        self.pids = pids
        self.values = values
        self.times = times
        self.starts = starts

    def __len__(self) -> int:
        return len(self.pids)

    def rows(self) -> Iterator[tuple[int, Any, int, int]]:
        """Yield ``(pid, value, time, start)`` per row."""
        n = len(self.pids)
        times = [self.times] * n if isinstance(self.times, int) else self.times
        starts = [self.starts] * n if isinstance(self.starts, int) else self.starts
        return zip(self.pids, self.values, times, starts, strict=True)

    def refused(self) -> list[int]:
        """Return the indexes of the rows that break a rule, and make the columns typed arrays.

        The common case is C-level scans only: the values, times and start times become arrays
        of the metric's type codes (which refuses floats for int metrics and ints outside
        int64) and :func:`check`'s rules are tested with ``min``/``max``/``sum``. A block that
        fails one is checked row by row (bools and non-numbers refused as ``MetricBuffer.add``
        refuses them).
        """
        n = len(self.pids)
        if not n:
            return []
        try:
            self.pids = _typed("q", self.pids)
            self.values = _typed(value_code(self.spec), self.values)
            if not isinstance(self.times, int):
                self.times = _typed("q", self.times)
            if not isinstance(self.starts, int):
                self.starts = _typed("q", self.starts)
        except (TypeError, OverflowError):
            return self._bad_rows()
        times = (self.times,) if isinstance(self.times, int) else self.times
        starts = (self.starts,) if isinstance(self.starts, int) else self.starts
        if min(self.pids) > 0 and _all_ok(self.spec, times, self.values, starts):
            return []
        return self._bad_rows()

    def _bad_rows(self) -> list[int]:
        int_only = self.spec.value_type is ValueType.INT
        bad = []
        for i, (pid, v, t, s) in enumerate(self.rows()):
            kind = type(v)
            if (
                type(pid) is not int
                or not 0 < pid < 2**63
                or (not (kind is int or kind is float) and not _number_ok(v, int_only))
                or (int_only and not isinstance(v, int))
                or (int_only and not -(2**63) <= v < 2**63)
                or type(t) is not int
                or type(s) is not int
                or not -(2**63) <= t < 2**63
                or not -(2**63) <= s < 2**63
                or _bad_rows(self.spec, (t,), (v,), (s,))
            ):
                bad.append(i)
        return bad

    def without(self, rows: Iterable[int]) -> ProcessBlock:
        """Return a copy of this block without ``rows`` (indexes)."""
        drop = set(rows)
        keep = [r for i, r in enumerate(self.rows()) if i not in drop]
        return ProcessBlock(
            self.spec,
            self.attributes,
            [r[0] for r in keep],
            [r[1] for r in keep],
            [r[2] for r in keep],
            [r[3] for r in keep],
        )


class ProcessColumns:
    """One metric's per-process points of a batch: a row per point, with its pid.

    Rows arrive a whole :class:`ProcessBlock` at a time (:meth:`add_block`: C-level extends,
    nothing per row in Python); the encoder orders them by pid when it writes each process's
    resource (stable: a process's points keep their arrival order).

    Attributes:
        spec: the metric's catalogue spec.
        pids: each row's process id.
        attrs_index: each row's attribute tuple, as an index into :attr:`attributes`.
        attributes: the distinct attribute tuples of the rows.
        times, values, starts: as in :class:`MetricColumns`.

    """

    __slots__ = ("spec", "pids", "attrs_index", "attributes", "times", "values", "starts", "_index")

    def __init__(self, spec: MetricSpec) -> None:
        self.spec = spec
        self.pids = array("q")
        self.attrs_index = array("I")
        self.attributes: list[Attributes] = []
        self.times = array("q")
        self.values = array(value_code(spec))
        self.starts = array("q")
        self._index: dict[Any, int] = {}

    def __len__(self) -> int:
        return len(self.pids)

    def _attrs_index(self, attributes: Attributes) -> int:
        try:
            i = self._index.get(attributes)
        except TypeError:  # an unhashable value (a list): found by equality
            for i, known in enumerate(self.attributes):
                if known == attributes:
                    return i
            i = None
        if i is None:
            i = len(self.attributes)
            self.attributes.append(attributes)
            try:
                self._index[attributes] = i
            except TypeError:
                pass
        return i

    def add_block(self, block: ProcessBlock) -> int:
        """Append the rows of ``block`` (checked by :meth:`ProcessBlock.refused`); return them."""
        n = len(block.pids)
        self.pids.extend(block.pids)
        self.attrs_index.extend(repeat(self._attrs_index(block.attributes), n))
        self.values.extend(block.values)
        times, starts = block.times, block.starts
        self.times.extend(repeat(times, n) if isinstance(times, int) else times)
        self.starts.extend(repeat(starts, n) if isinstance(starts, int) else starts)
        return n

    def add(self, pid: int, value: Any, time_ns: int, attributes: Attributes, start: int) -> bool:
        """Append one row; False (nothing appended) when a column cannot hold it."""
        kind = type(value)
        if (
            kind is not float
            and kind is not int
            and not _number_ok(value, self.values.typecode == "q")
        ):
            return False
        n = len(self.pids)
        try:
            self.values.append(value)
            self.times.append(time_ns)
            self.starts.append(start)
            self.pids.append(pid)
        except (TypeError, OverflowError):
            for col in (self.values, self.times, self.starts, self.pids):
                del col[n:]
            return False
        self.attrs_index.append(self._attrs_index(attributes))
        return True

    def check(self) -> int:
        """Drop the rows that break :func:`check`'s rules or have a pid <= 0; return how many."""
        if not len(self.pids) or (
            min(self.pids) > 0 and _all_ok(self.spec, self.times, self.values, self.starts)
        ):
            return 0
        bad = {i for i, p in enumerate(self.pids) if p <= 0}
        bad.update(_bad_rows(self.spec, self.times, self.values, self.starts))
        for i in sorted(bad, reverse=True):
            for col in (self.pids, self.attrs_index, self.times, self.values, self.starts):
                del col[i]
        return len(bad)

    def by_pid(self) -> dict[int, MetricColumns]:
        """Return the rows as one :class:`MetricColumns` per pid (tests, the seed's API)."""
        out: dict[int, MetricColumns] = {}
        for pid, ai, t, v, s in zip(
            self.pids, self.attrs_index, self.times, self.values, self.starts, strict=True
        ):
            mc = out.get(pid)
            if mc is None:
                mc = out[pid] = MetricColumns(self.spec)
            mc.add(v, t, self.attributes[ai], s)
        return out


_NUMBER_TYPES = frozenset({int, float})


def _typed(code: str, column: Sequence[Any]) -> array[Any]:
    """``column`` as an ``array(code)``; TypeError when it holds anything but ints and floats."""
    if isinstance(column, array) and column.typecode == code:
        return column
    if not _NUMBER_TYPES.issuperset(map(type, column)):
        raise TypeError("not a column of ints and floats")
    return array(code, column)


class ResourceColumns(dict[str, MetricColumns]):
    """The metrics of one resource (name → :class:`MetricColumns`), in first-use order."""

    __slots__ = ()

    def columns(self, spec: MetricSpec) -> MetricColumns:
        """Return the columns of ``spec``'s metric, created on first use."""
        mc = self.get(spec.name)
        if mc is None:
            mc = self[spec.name] = MetricColumns(spec)
        return mc

    def count(self) -> int:
        """Total number of points held."""
        return sum(len(mc) for mc in self.values())


class Points:
    """The points gathered by one device's tick, committed together or not at all.

    Device points go into per-metric :class:`MetricColumns` (:meth:`add`); per-process points
    come as whole :class:`ProcessBlock` tables (:meth:`add_block`). ``specs`` defaults to the
    catalogue's GPU metrics.

    Attributes:
        host: device points by metric name, in first-use order.
        blocks: per-process tables, in the order they were read.
        refused: points whose value type their metric cannot hold (not added).

    """

    __slots__ = ("host", "blocks", "refused", "_specs")

    def __init__(self, specs: Mapping[str, MetricSpec] | None = None) -> None:
        self._specs = specs if specs is not None else catalogue().metrics
        self.host = ResourceColumns()
        self.blocks: list[ProcessBlock] = []
        self.refused = 0

    def spec(self, metric: str) -> MetricSpec:
        """Return the spec of ``metric``.

        Raises:
            UnknownMetricError: ``metric`` is not in the catalogue.

        """
        spec = self._specs.get(metric)
        if spec is None:
            raise UnknownMetricError(metric)
        return spec

    def add(
        self, metric: str, value: Any, time_ns: int, attrs: Attributes, start_ns: int = 0
    ) -> None:
        """Add one device point (value in the metric's unit, times in Unix-epoch ns).

        Raises:
            UnknownMetricError: ``metric`` is not in the catalogue.

        """
        mc = self.host.get(metric)
        if mc is None:
            mc = self.host[metric] = MetricColumns(self.spec(metric))
        if not mc.add(value, time_ns, attrs, start_ns):
            self.refused += 1

    def add_block(self, block: ProcessBlock) -> None:
        """Add one per-process table."""
        if len(block):
            self.blocks.append(block)

    def block(
        self,
        metric: str,
        attributes: Attributes,
        pids: Sequence[int],
        values: Sequence[Any],
        times: Sequence[int] | int,
        starts: Sequence[int] | int = 0,
    ) -> None:
        """Build and add a :class:`ProcessBlock` of ``metric`` (arguments as the block's)."""
        self.add_block(ProcessBlock(self.spec(metric), attributes, pids, values, times, starts))

    def extend(self, other: Points) -> None:
        """Append ``other``'s points (a MIG instance's into its GPU's)."""
        for name, mc in other.host.items():
            mine = self.host.get(name)
            if mine is None:
                self.host[name] = mc
            else:
                mine.extend(mc)
        self.blocks.extend(other.blocks)
        self.refused += other.refused

    def __len__(self) -> int:
        """Return the number of points held."""
        return self.host.count() + sum(len(b) for b in self.blocks)

    def __bool__(self) -> bool:
        return bool(self.host) or bool(self.blocks)

    def process_points(self) -> Iterable[tuple[int, str, Point]]:
        """Yield ``(pid, metric, point)`` for every per-process point (tests)."""
        for b in self.blocks:
            for pid, v, t, s in b.rows():
                yield pid, b.spec.name, Point(v, t, b.attributes, s)
