"""``gpumetrics serve``: load the configuration, set up logging, run standalone or as a plugin."""

from __future__ import annotations

import argparse
import logging
import os
from typing import Any, TextIO

from gpumetrics.cli.client import CommandError
from gpumetrics.cli.parser import SERVE_FLAGS, serve_overrides
from gpumetrics.config import ConfigError, config_sources, load_config, unknown_variables
from gpumetrics.config.model import LogFormatSetting
from gpumetrics.logs import LogFormat, configure_logging
from gpumetrics.service.plugin import COOKIE_KEY, PluginError

__all__ = ["cmd_serve"]

log = logging.getLogger(__name__)

_FLAG_OF = {path: flag for flag, path, _ in SERVE_FLAGS} | {"runtime.simulate": "--simulate"}
"""The ``serve`` flag of each setting that has one (named when the default is the problem)."""


def cmd_serve(args: argparse.Namespace, handshake: TextIO | None, **sidecar_options: Any) -> int:
    """Run the sidecar; ``handshake`` is the saved real stdout in go-plugin mode, else None.

    ``sidecar_options`` are passed to :class:`gpumetrics.runtime.Sidecar`.

    Raises:
        CommandError: exit 2 for a configuration error, 1 when go-plugin mode is refused.

    """
    if args.plugin and handshake is None:
        raise CommandError(
            f"--plugin: go-plugin mode needs the {COOKIE_KEY} variable the collector's "
            "gpumetrics receiver sets; run without --plugin to serve standalone"
        )
    unknown = unknown_variables(os.environ, ignore=(COOKIE_KEY,))
    overrides = serve_overrides(args)
    try:
        config = load_config(args.config, os.environ, overrides)
        sources = config_sources(args.config, os.environ, overrides, _FLAG_OF)
    except ConfigError as exc:
        lines = exc.errors + [f"unknown variable {name} ignored (a typo?)" for name in unknown]
        raise CommandError("\ngpumetrics: ".join(lines), 2) from None
    fmt = config.log.format
    if fmt is LogFormatSetting.AUTO:
        fmt = LogFormatSetting.JSON if handshake is not None else LogFormatSetting.TEXT
    configure_logging(config.log.level, LogFormat(fmt.value))
    logging.captureWarnings(True)
    for name in unknown:
        log.warning("ignoring unknown variable %s (see docs/configuration.md)", name)

    from gpumetrics.runtime.run import serve_plugin, serve_standalone

    options = {"config_file": sources.file, **sidecar_options}
    try:
        if handshake is not None:
            return serve_plugin(config, handshake, **options)
        return serve_standalone(config, **options)
    except ConfigError as exc:
        raise CommandError("\ngpumetrics: ".join(exc.with_sources(sources).errors), 2) from None
    except PluginError as exc:
        raise CommandError(str(exc), 1) from None
