"""Load the configuration: defaults < YAML file < ``GPUMETRICS_*`` variables < command-line flags.

:func:`load_config` merges the layers into one mapping, validates it once with
:class:`~gpumetrics.config.model.SidecarConfig`, and turns every failure into a
:class:`ConfigError` whose lines quote the setting's dotted path and say where the value came
from::

    'runtime.batch_interval_s' (from GPUMETRICS_BATCH_INTERVAL_S='soon'): Input should be a ...
    'store.max_bytes' (from flag --store-max-bytes): Input should be greater than 0
    'push.cert_file' (from /etc/gpumetrics.yaml): must be set together with key_file
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import yaml
from pydantic import ValidationError

from gpumetrics.config.env import GPUMETRICS_CONFIG, env_overrides
from gpumetrics.config.model import SidecarConfig
from gpumetrics.yamlfile import UniqueKeyLoader, decode_utf8, yaml_problem

__all__ = [
    "ConfigError",
    "ConfigSources",
    "config_sources",
    "format_validation_error",
    "load_config",
    "read_config_file",
]

_FIELD_PREFIX = re.compile(
    r"^'?([A-Za-z_][A-Za-z0-9_]*(?:\[\d+\])*(?:\.[A-Za-z_][A-Za-z0-9_]*(?:\[\d+\])*)*)'?: (.*)$",
    re.S,
)


class ConfigError(ValueError):
    """The configuration is invalid; ``errors`` has one line per problem, naming the setting.

    A problem found after loading (a token file that cannot be read, a port in use) is made with
    :meth:`setting`, which keeps the dotted path apart from the reason, so that
    :meth:`with_sources` can say where the value came from, as load-time errors do.
    """

    def __init__(self, errors: list[str]) -> None:
        self.errors = list(errors)
        self.settings: list[tuple[str, str]] = []
        """``(dotted path, reason)`` of the problems made with :meth:`setting`."""
        super().__init__("; ".join(self.errors))

    @classmethod
    def setting(cls, path: str, reason: str, *more: str) -> ConfigError:
        """Problems with the setting at ``path``, one line each (``'path': reason``).

        >>> str(ConfigError.setting("server.pull_token_file", "holds no token"))
        "'server.pull_token_file': holds no token"
        """
        reasons = [reason, *more]
        error = cls([f"'{path}': {r}" for r in reasons])
        error.settings = [(path, r) for r in reasons]
        return error

    def with_sources(self, sources: ConfigSources) -> ConfigError:
        """Return this error with each setting's source in its line (other lines unchanged).

        >>> err = ConfigError.setting("server.listen[0]", "in use")
        >>> err.with_sources(ConfigSources({"server.listen": "flag --listen"})).errors
        ["'server.listen[0]' (from flag --listen): in use"]
        """
        if not self.settings:
            return self
        lines = [f"'{path}' ({sources.describe(path)}): {reason}" for path, reason in self.settings]
        out = ConfigError(lines)
        out.settings = list(self.settings)
        return out


@dataclass(frozen=True)
class ConfigSources:
    """Where each setting's value came from, for error messages.

    Attributes:
        values: dotted path -> ``flag --x`` or ``NAME='value'`` (flags and variables).
        file: the YAML file, if one was loaded.
        file_paths: dotted paths the file sets (a path under one of them came from the file).
        flags: dotted path -> the command-line flag that sets it, named for a default value.

    """

    values: Mapping[str, str] = field(default_factory=dict)
    file: str | None = None
    file_paths: frozenset[str] = frozenset()
    flags: Mapping[str, str] = field(default_factory=dict)

    def describe(self, path: str) -> str:
        """``from flag --listen``, ``from GPUMETRICS_X='v'``, ``from FILE`` or ``default``.

        A default names the flag that changes it, when there is one: ``default; set --listen``.
        """
        source = _source_of(path, self.values)
        if source is None and self.file is not None:
            if _source_of(path, dict.fromkeys(self.file_paths, self.file)) is not None:
                source = self.file
        if source is not None:
            return f"from {source}"
        flag = _source_of(path, self.flags)
        return f"default; set {flag}" if flag else "default"


def _leaf_paths(tree: Mapping[str, Any], prefix: str = "") -> set[str]:
    out: set[str] = set()
    for key, value in tree.items():
        path = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            out |= _leaf_paths(value, path + ".")
        else:
            out.add(path)
    return out


def read_config_file(path: str, origin: str | None = None) -> dict[str, Any]:
    """Parse the YAML file at ``path`` into a mapping (an empty file is ``{}``).

    ``origin`` says where the path came from when it was not the ``--config`` flag (the
    ``GPUMETRICS_CONFIG`` variable); messages then read ``config file PATH (from ORIGIN): ...``.

    Raises:
        ConfigError: unreadable file, bytes that are not UTF-8 (offset and line), a YAML syntax
            error or a key written twice in one mapping (line and column), or a top level that
            is not a mapping.

    """
    name = f"config file {path}" + (f" (from {origin})" if origin else "")
    try:
        with open(path, "rb") as f:
            text = decode_utf8(f.read())
        data = yaml.load(text, Loader=UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass
    except OSError as exc:
        raise ConfigError([f"{name}: {exc.strerror or exc}"]) from None
    except yaml.YAMLError as exc:
        raise ConfigError([f"{name}: {yaml_problem(exc)}"]) from None
    except RecursionError:  # PyYAML's parser recurses once per nesting level
        raise ConfigError([f"{name}: nested too deeply"]) from None
    except ValueError as exc:  # decode_utf8: not UTF-8
        raise ConfigError([f"{name}: {exc}"]) from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError([f"{name}: the top level must be a mapping of sections"])
    return data


def _set_path(tree: dict[str, Any], path: str, value: Any) -> None:
    parts = path.split(".")
    node = tree
    for part in parts[:-1]:
        child = node.get(part)
        if not isinstance(child, dict):
            child = node[part] = {}
        node = child
    node[parts[-1]] = value


def _loc_path(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out


def format_validation_error(
    error: ValidationError,
    sources: Mapping[str, str] | None = None,
    default_source: str | None = None,
) -> list[str]:
    """One line per pydantic error: ``'dotted.path' (from SOURCE): message``.

    ``sources`` maps dotted paths to where their value came from (a variable with its value, a
    flag); others get ``default_source`` (the file) when given. A message of the form
    ``field: text`` raised by a model validator is attached to that field's path.
    """
    lines = []
    for err in error.errors():
        msg = str(err.get("msg", ""))
        for prefix in ("Value error, ", "Assertion failed, "):
            if msg.startswith(prefix):
                msg = msg[len(prefix) :]
        path = _loc_path(tuple(err.get("loc", ())))
        match = _FIELD_PREFIX.match(msg)
        if match:
            path = _join_field(path, match.group(1))
            msg = match.group(2)
        if err.get("type") == "extra_forbidden":
            msg = "unknown setting"
        elif err.get("type") == "finite_number":  # NaN or infinity (settingsbase)
            msg = f"must be a finite number, got {err.get('input')}"
        source = _source_of(path, sources or {}) or default_source
        lines.append(f"'{path}'" + (f" (from {source})" if source else "") + f": {msg}")
    return lines


def _join_field(path: str, field: str) -> str:
    """Attach a validator's ``field`` (relative, e.g. ``listen[0]``) to the error's ``path``.

    A field validator of ``server.listen`` names the item it rejects (``listen[0]``): that is
    the last segment of the path made more precise, so it replaces it (``server.listen[0]``)
    rather than being appended to it (``server.listen.listen[0]``).
    """
    if path == field or path.endswith("." + field):
        return path
    parent, _, last = path.rpartition(".")
    if last and field.startswith(last + "["):
        return f"{parent}.{field}" if parent else field
    return f"{path}.{field}" if path else field


def _source_of(path: str, sources: Mapping[str, str]) -> str | None:
    best = None
    for key, source in sources.items():
        if path == key or path.startswith(key + ".") or path.startswith(key + "["):
            if best is None or len(key) > len(best[0]):
                best = (key, source)
    return best[1] if best else None


def _layers(
    path: str | None,
    environ: Mapping[str, str],
    flags: Mapping[str, tuple[str, Any]],
    flag_names: Mapping[str, str] | None = None,
    origin: str | None = None,
) -> tuple[dict[str, Any], ConfigSources]:
    tree: dict[str, Any] = read_config_file(path, origin) if path is not None else {}
    file_paths = frozenset(_leaf_paths(tree))
    values: dict[str, str] = {}
    try:
        overrides = env_overrides(environ)
    except ValueError as exc:
        raise ConfigError([str(exc)]) from None
    for key, (name, value) in overrides.items():
        _set_path(tree, key, value)
        values[key] = f"{name}={environ[name]!r}"
    for key, (flag, value) in flags.items():
        _set_path(tree, key, value)
        values[key] = f"flag {flag}"
    return tree, ConfigSources(values, path, file_paths, dict(flag_names or {}))


def _config_path(path: str | None, environ: Mapping[str, str]) -> tuple[str | None, str | None]:
    """Return the config file and, when ``GPUMETRICS_CONFIG`` named it, that variable's name."""
    if path is not None:
        return path, None
    from_env = environ.get(GPUMETRICS_CONFIG) or None
    return from_env, GPUMETRICS_CONFIG if from_env else None


def config_sources(
    path: str | None = None,
    environ: Mapping[str, str] | None = None,
    flags: Mapping[str, tuple[str, Any]] | None = None,
    flag_names: Mapping[str, str] | None = None,
) -> ConfigSources:
    """Where each setting comes from, for the same arguments as :func:`load_config`.

    ``flag_names`` (dotted path -> flag) lets a default value name the flag that changes it.

    Raises:
        ConfigError: as :func:`load_config` (the file or a variable cannot be read).

    """
    env = os.environ if environ is None else environ
    path, origin = _config_path(path, env)
    return _layers(path, env, flags or {}, flag_names, origin)[1]


def load_config(
    path: str | None = None,
    environ: Mapping[str, str] | None = None,
    flags: Mapping[str, tuple[str, Any]] | None = None,
) -> SidecarConfig:
    """Build the validated configuration from its layers.

    Args:
        path: YAML file; None = ``$GPUMETRICS_CONFIG`` if set, else no file.
        environ: environment (default ``os.environ``); only the bound ``GPUMETRICS_*`` are read.
        flags: ``{dotted_path: (flag_name, value)}`` from the command line (highest precedence).

    Raises:
        ConfigError: every problem found, each line naming the setting and its source.

    """
    env = os.environ if environ is None else environ
    path, origin = _config_path(path, env)
    tree, sources = _layers(path, env, flags or {}, origin=origin)
    try:
        return SidecarConfig.model_validate(tree)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc, sources.values, path)) from None
