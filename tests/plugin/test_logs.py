"""hclog-compatible log lines and the duplicate-suppressing helpers."""

from __future__ import annotations

import io
import json
import logging
import re

import pytest
from gpumetrics.logs import DuplicateFilter, LogOnce, configure_logging

HCLOG_TS = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}(Z|[+-]\d\d:\d\d)$")


@pytest.fixture
def logger():
    lg = logging.getLogger("gpumetrics.test.logs")
    yield lg
    for h in [h for h in lg.handlers if h.get_name() == "gpumetrics"]:
        lg.removeHandler(h)
    lg.filters.clear()


def test_json_lines_have_string_hclog_keys_and_extra_fields(logger):
    out = io.StringIO()
    configure_logging("debug", "json", out, logger)
    logger.warning("ready in %d ms", 12, extra={"address": "127.0.0.1:1", "devices": 8})
    try:
        raise ValueError("boom")
    except ValueError:
        logger.exception("failed")
    lines = out.getvalue().splitlines()
    assert len(lines) == 2
    first, second = (json.loads(line) for line in lines)
    for entry in (first, second):
        for key in ("@level", "@message", "@timestamp", "@module"):
            assert isinstance(entry[key], str)
        assert HCLOG_TS.match(entry["@timestamp"])
    assert first["@level"] == "warn" and first["@message"] == "ready in 12 ms"
    assert first["address"] == "127.0.0.1:1" and first["devices"] == 8
    assert second["@level"] == "error" and "ValueError: boom" in second["exception"]


def test_text_lines_start_with_the_level_prefix_go_plugin_reads(logger):
    out = io.StringIO()
    configure_logging("info", "text", out, logger)
    logger.debug("hidden")
    logger.info("serving", extra={"address": "unix:/x"})
    logger.error("bad")
    lines = out.getvalue().splitlines()
    assert len(lines) == 2
    assert lines[0].startswith("[INFO] ") and lines[0].endswith(
        "gpumetrics.test.logs: serving address=unix:/x"
    )
    assert lines[1].startswith("[ERROR] ")


def test_configure_twice_does_not_duplicate_lines(logger):
    out = io.StringIO()
    configure_logging("info", "text", out, logger)
    configure_logging("info", "text", out, logger)
    logger.info("once")
    assert out.getvalue().count("once") == 1


def test_unknown_level_names_the_value(logger):
    with pytest.raises(ValueError, match="'loud'"):
        configure_logging("loud", "text", io.StringIO(), logger)


def test_log_once_logs_once_until_reset(logger, caplog):
    once = LogOnce(logger)
    with caplog.at_level(logging.WARNING, logger=logger.name):
        assert once.log(logging.WARNING, "nvml", "lost %s", "GPU-1")
        assert not once.log(logging.WARNING, "nvml", "lost %s", "GPU-1")
        assert not once.log(logging.WARNING, "nvml", "lost %s", "GPU-1")
        assert once.suppressed("nvml") == 2
        assert once.reset("nvml")
        assert once.log(logging.WARNING, "nvml", "lost %s", "GPU-1")
    assert [r.getMessage() for r in caplog.records] == ["lost GPU-1", "lost GPU-1"]


def test_log_once_repeats_after_the_window_with_the_suppressed_count(logger, caplog):
    now = [0.0]
    once = LogOnce(logger, repeat_after_s=60, clock=lambda: now[0])
    with caplog.at_level(logging.WARNING, logger=logger.name):
        once.log(logging.WARNING, "k", "still failing")
        now[0] = 30
        once.log(logging.WARNING, "k", "still failing")
        now[0] = 61
        assert once.log(logging.WARNING, "k", "still failing")
    assert len(caplog.records) == 2
    assert caplog.records[1].suppressed == 1


def test_duplicate_filter_drops_identical_records_inside_the_window(logger):
    out = io.StringIO()
    configure_logging("info", "text", out, logger)
    now = [0.0]
    logger.addFilter(DuplicateFilter(window_s=20, clock=lambda: now[0]))
    logger.info("x %s", 1)
    logger.info("x %s", 1)
    logger.info("x %s", 2)
    now[0] = 21
    logger.info("x %s", 1)
    assert [line.rsplit(": ", 1)[1] for line in out.getvalue().splitlines()] == [
        "x 1",
        "x 2",
        "x 1",
    ]
