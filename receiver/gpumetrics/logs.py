"""Logging for the sidecar: structured records on stderr, and duplicate suppression.

Two line formats, both readable by a go-plugin host (hashicorp/go-plugin ``log_entry.go`` and
``client.go`` ``logStderr``, https://github.com/hashicorp/go-plugin):

* ``json``: one hclog-compatible JSON object per line. ``@level`` (``trace``/``debug``/``info``/
  ``warn``/``error``), ``@message``, ``@timestamp`` (Go layout ``2006-01-02T15:04:05.000000Z07:00``,
  always UTC here) and ``@module`` (the logger name) are **always strings**: go-plugin's parser
  type-asserts them and a non-string would panic the host. Fields passed with ``extra=`` become
  further keys; an exception becomes ``exception``.
* ``text``: ``[INFO]  2026-01-02T15:04:05.000000Z gpumetrics.runtime: message key=value``. The
  level prefix comes first because go-plugin infers a non-JSON line's level from it.

Duplicate suppression (style item 18): :class:`LogOnce` logs a keyed condition once until it is
reset, and :class:`DuplicateFilter` drops identical records inside a time window, like the
OpenTelemetry SDK's ``DuplicateFilter``. Both are per-instance (no module-level state).
"""

from __future__ import annotations

import datetime as _dt
import enum
import json
import logging
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, TextIO

__all__ = [
    "DuplicateFilter",
    "HclogJSONFormatter",
    "LogFormat",
    "LogOnce",
    "TextFormatter",
    "configure_logging",
    "hclog_level",
    "hclog_timestamp",
]

# Attributes every LogRecord has; anything else on a record came from ``extra=``.
_STANDARD_ATTRS = frozenset(vars(logging.LogRecord("n", 0, "p", 0, "m", None, None))) | {
    "message",
    "asctime",
    "taskName",
}


class LogFormat(enum.StrEnum):
    """Line format of the sidecar's stderr log."""

    JSON = "json"
    TEXT = "text"


def hclog_level(levelno: int) -> str:
    """Return the hclog level name of a ``logging`` level number (``WARNING`` → ``warn``)."""
    if levelno >= logging.ERROR:
        return "error"
    if levelno >= logging.WARNING:
        return "warn"
    if levelno >= logging.INFO:
        return "info"
    if levelno >= logging.DEBUG:
        return "debug"
    return "trace"


def hclog_timestamp(created_s: float) -> str:
    """Format a ``time.time()`` value (s since the epoch) in hclog's layout, in UTC.

    >>> hclog_timestamp(0.5)
    '1970-01-01T00:00:00.500000Z'
    """
    when = _dt.datetime.fromtimestamp(created_s, tz=_dt.UTC)
    return when.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _extra_fields(record: logging.LogRecord) -> dict[str, Any]:
    return {
        k: v for k, v in vars(record).items() if k not in _STANDARD_ATTRS and not k.startswith("_")
    }


class HclogJSONFormatter(logging.Formatter):
    """One hclog-compatible JSON object per record (see the module docstring)."""

    def format(self, record: logging.LogRecord) -> str:
        """Render ``record`` as a single JSON line (no newline inside)."""
        entry: dict[str, Any] = {
            "@level": hclog_level(record.levelno),
            "@message": str(record.getMessage()),
            "@timestamp": hclog_timestamp(record.created),
            "@module": str(record.name),
        }
        for key, value in _extra_fields(record).items():
            entry[key] = (
                value
                if isinstance(value, str | int | float | bool) or value is None
                else str(value)
            )
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False, default=str)


class TextFormatter(logging.Formatter):
    """``[LEVEL]  timestamp logger: message key=value`` lines (see the module docstring)."""

    def format(self, record: logging.LogRecord) -> str:
        """Render ``record`` as text; an exception's traceback follows on the next lines."""
        level = "[" + hclog_level(record.levelno).upper() + "]"
        line = f"{level:<7} {hclog_timestamp(record.created)} {record.name}: {record.getMessage()}"
        fields = _extra_fields(record)
        if fields:
            line += " " + " ".join(f"{k}={v}" for k, v in fields.items())
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


def configure_logging(
    level: str | int = "info",
    fmt: LogFormat | str = LogFormat.TEXT,
    stream: TextIO | None = None,
    logger: logging.Logger | None = None,
) -> logging.Handler:
    """Send records of ``logger`` (default: the root logger) to ``stream`` (default stderr).

    Replaces handlers this function installed earlier on the same logger, so calling it twice
    does not duplicate lines.

    Args:
        level: ``trace``/``debug``/``info``/``warn``/``warning``/``error`` or a ``logging`` number.
        fmt: :class:`LogFormat` or its value.
        stream: where lines go (default ``sys.stderr``).
        logger: the logger to configure (default the root logger).

    Returns:
        The installed handler.

    Raises:
        ValueError: unknown level or format (the message names the value).

    """
    target = logger if logger is not None else logging.getLogger()
    formatter: logging.Formatter = (
        HclogJSONFormatter() if LogFormat(fmt) is LogFormat.JSON else TextFormatter()
    )
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(formatter)
    handler.set_name("gpumetrics")
    for old in list(target.handlers):
        if old.get_name() == "gpumetrics":
            target.removeHandler(old)
    target.addHandler(handler)
    target.setLevel(_level_number(level))
    return handler


def _level_number(level: str | int) -> int:
    if isinstance(level, int):
        return level
    names = {
        "trace": 5,
        "debug": logging.DEBUG,
        "info": logging.INFO,
        "warn": logging.WARNING,
        "warning": logging.WARNING,
        "error": logging.ERROR,
    }
    try:
        return names[level.lower()]
    except KeyError:
        raise ValueError(f"log level: must be one of {sorted(names)}, got {level!r}") from None


class LogOnce:
    """Log a keyed condition once, count its repeats, and log again only after :meth:`reset`.

    Args:
        logger: where the first occurrence goes.
        repeat_after_s: when set, a still-ongoing condition is logged again after this many
            seconds, with the number of suppressed repeats in the ``suppressed`` field.
        clock: monotonic seconds (injectable for tests).

    Thread-safe. Typical use: ``once.log(logging.WARNING, ("nvml", code), "NVML failed: %s", err)``
    on every failure, and ``once.reset(("nvml", code))`` when the call succeeds again.

    """

    def __init__(
        self,
        logger: logging.Logger,
        repeat_after_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._logger = logger
        self._repeat_after_s = repeat_after_s
        self._clock = clock
        self._lock = threading.Lock()
        self._seen: dict[object, tuple[float, int]] = {}

    def log(self, level: int, key: object, msg: str, *args: object, **kwargs: Any) -> bool:
        """Log ``msg % args`` at ``level`` unless ``key`` is already logged; True if logged."""
        now = self._clock()
        with self._lock:
            seen = self._seen.get(key)
            if seen is not None:
                since, repeats = seen
                if self._repeat_after_s is None or now - since < self._repeat_after_s:
                    self._seen[key] = (since, repeats + 1)
                    return False
                extra = dict(kwargs.pop("extra", None) or {})
                extra["suppressed"] = repeats
                kwargs["extra"] = extra
            self._seen[key] = (now, 0)
        self._logger.log(level, msg, *args, **kwargs)
        return True

    def suppressed(self, key: object) -> int:
        """Repeats of ``key`` swallowed since it was last logged (0 if never seen)."""
        with self._lock:
            seen = self._seen.get(key)
            return seen[1] if seen else 0

    def reset(self, key: object) -> bool:
        """Forget ``key`` (the condition cleared); return True if it had been seen."""
        with self._lock:
            return self._seen.pop(key, None) is not None


class DuplicateFilter(logging.Filter):
    """Drop a record identical to one passed within the last ``window_s`` seconds.

    Identical means same logger, level, format string and arguments. At most ``max_keys`` keys
    are remembered (oldest forgotten first), so memory stays bounded.
    """

    def __init__(
        self,
        window_s: float = 20.0,
        clock: Callable[[], float] = time.monotonic,
        max_keys: int = 1024,
    ) -> None:
        super().__init__()
        self._window_s = window_s
        self._clock = clock
        self._max_keys = max_keys
        self._lock = threading.Lock()
        self._last: dict[tuple[Any, ...], float] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        """Return False (drop) for a duplicate inside the window."""
        try:
            key: tuple[Any, ...] = (record.name, record.levelno, record.msg, repr(record.args))
        except Exception:  # noqa: BLE001 - a broken repr must not break logging
            return True
        now = self._clock()
        with self._lock:
            last = self._last.get(key)
            if last is not None and now - last < self._window_s:
                return False
            self._last.pop(key, None)
            self._last[key] = now
            while len(self._last) > self._max_keys:
                del self._last[next(iter(self._last))]
        return True
