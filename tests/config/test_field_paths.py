"""A validator's own field path (``listen[0]``) merges with the setting's path, never repeats it."""

from __future__ import annotations

import pytest
from gpumetrics.config import ConfigError, load_config


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        (
            {"server.listen": ("--listen", ["unix-abstract:foo"])},
            "'server.listen[0]' (from flag --listen): abstract unix sockets have no file mode",
        ),
        (
            {"server.profiler_listen": ("--profiler-listen", ["127.0.0.1:1", "unix-abstract:x"])},
            "'server.profiler_listen[1]' (from flag --profiler-listen): abstract unix sockets",
        ),
        (
            {"server.health_listen": ("--health-listen", "nowhere")},
            "'server.health_listen' (from flag --health-listen): 'nowhere' must be host:port",
        ),
    ],
)
def test_listen_errors_name_the_setting_once(flags, expected):
    with pytest.raises(ConfigError) as err:
        load_config(None, {}, flags)
    assert any(e.startswith(expected) for e in err.value.errors), err.value.errors
