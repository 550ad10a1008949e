"""Loading scenarios from YAML files, built-in profiles, field cases or Python data.

Every problem is reported as a :class:`ScenarioError` whose message lists each offending
field by path (``devices[1].processes[0].pid: ...``), so a broken file fails fast at load.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from nvmlsim.model.checks import check_scenario
from nvmlsim.model.scenario import Scenario

__all__ = [
    "ScenarioError",
    "load_scenario",
    "scenario_from_data",
    "list_profiles",
    "profile_path",
    "list_field_cases",
    "field_case_path",
    "scenario_json_schema",
    "DEFAULT_PROFILE",
]

#: The profile a program uses when asked for "the default" (an 8-GPU H100 training node).
DEFAULT_PROFILE = "h100-8x-training"

_PROFILE_PACKAGE = "nvmlsim.profiles"
_FIELD_CASE_PACKAGE = "nvmlsim.fieldcases"
# Segments pydantic inserts into error locations for union members and validators.
_TAG = re.compile(
    r"^(int|float|str|bool|bytes|none|constrained-.*|literal\[.*\]|function-.*|"
    r"tagged-union\[.*\]|list\[.*\]|dict\[.*\]|lax-.*|json-or-python\[.*\]|is-instance\[.*\])$"
)


class ScenarioError(ValueError):
    """A scenario could not be loaded.

    Attributes:
        source: file path or profile name (``"<data>"`` for Python data).
        problems: ``(path, message)`` pairs; ``path`` is like ``devices[0].memory.total_bytes``
            (empty for problems of the whole file).

    """

    def __init__(self, source: str, problems: list[tuple[str, str]]) -> None:
        self.source = source
        self.problems = problems
        lines = [f"{p}: {m}" if p else m for p, m in problems]
        super().__init__(f"invalid scenario {source}:\n  " + "\n  ".join(lines))


class _UniqueKeyLoader(yaml.SafeLoader):
    """A safe YAML loader that rejects duplicate mapping keys instead of keeping the last."""


def _construct_mapping(loader: _UniqueKeyLoader, node: yaml.MappingNode) -> dict[Any, Any]:
    # Keys written twice in one mapping are an error; keys merged in with ``<<: *anchor``
    # may be overridden by the mapping's own keys (standard YAML merge semantics).
    seen: set[Any] = set()
    for key_node, _ in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge":
            continue
        key = loader.construct_object(key_node, deep=True)
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r}", key_node.start_mark
            )
        seen.add(key)
    loader.flatten_mapping(node)
    return {
        loader.construct_object(k, deep=True): loader.construct_object(v, deep=True)
        for k, v in node.value
    }


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def _loc_to_path(loc: tuple[int | str, ...]) -> str:
    path = ""
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        elif not _TAG.match(part):
            path += f".{part}" if path else part
    return path


_FIELD_PREFIX = re.compile(r"^([a-z_][a-z0-9_]*): (.*)$", re.S)
_TYPE_MISMATCH = re.compile(r"^Input should be a valid (integer|number)")


def _validation_problems(err: ValidationError) -> list[tuple[str, str]]:
    merged: dict[str, list[str]] = {}
    for e in err.errors(include_url=False):
        msg = e["msg"].removeprefix("Value error, ")
        path = _loc_to_path(tuple(e["loc"]))
        named = _FIELD_PREFIX.match(msg)
        if named:  # a model validator naming one of its fields: move it into the path
            path = f"{path}.{named.group(1)}" if path else named.group(1)
            msg = named.group(2)
        if msg not in merged.setdefault(path, []):
            merged[path].append(msg)
    # A pattern mapping that failed inside also fails as "not a number": drop that noise.
    for path, msgs in list(merged.items()):
        deeper = any(p.startswith(path + ".") for p in merged)
        if deeper and all(_TYPE_MISMATCH.match(m) for m in msgs):
            del merged[path]
    return [(p, "; or ".join(msgs)) for p, msgs in merged.items()]


def scenario_from_data(data: Any, source: str = "<data>") -> Scenario:
    """Validate ``data`` (a mapping as parsed from YAML) into a :class:`Scenario`.

    Raises:
        ScenarioError: listing every offending field by path.

    """
    if not isinstance(data, Mapping):
        raise ScenarioError(source, [("", "the top level must be a mapping")])
    try:
        scn = Scenario.model_validate(dict(data))
    except ValidationError as err:
        raise ScenarioError(source, _validation_problems(err)) from None
    problems = check_scenario(scn)
    if problems:
        raise ScenarioError(source, problems)
    return scn


def _names(package: str) -> list[str]:
    return sorted(
        entry.name.removesuffix(".yaml")
        for entry in resources.files(package).iterdir()
        if entry.name.endswith(".yaml")
    )


def _data_path(package: str, name: str) -> Path | None:
    entry = resources.files(package) / f"{name}.yaml"
    return Path(str(entry)) if entry.is_file() else None


def list_profiles() -> list[str]:
    """Names of the built-in profiles (YAML files shipped in ``nvmlsim/profiles/``), sorted."""
    return _names(_PROFILE_PACKAGE)


def list_field_cases() -> list[str]:
    """Names of the field-case scenarios (``nvmlsim/fieldcases/F01_...yaml``), sorted.

    Each stages one failure real drivers and bindings show (F01-F32, listed in the README).
    """
    return _names(_FIELD_CASE_PACKAGE)


def _unknown(name: str) -> ScenarioError:
    return ScenarioError(
        name,
        [
            (
                "",
                f"no such profile, field case or file; built-in profiles: "
                f"{', '.join(list_profiles())}; field cases: python -m nvmlsim list",
            )
        ],
    )


def profile_path(name: str) -> Path:
    """Filesystem path of built-in profile ``name``; raises ScenarioError if unknown."""
    path = _data_path(_PROFILE_PACKAGE, name)
    if path is None:
        raise _unknown(name)
    return path


def field_case_path(name: str) -> Path:
    """Filesystem path of field-case scenario ``name`` (a file stem such as ``F16_pid_reuse``).

    Raises:
        ScenarioError: no field case of that name.

    """
    path = _data_path(_FIELD_CASE_PACKAGE, name)
    if path is None:
        raise _unknown(name)
    return path


def _yaml_problem(err: yaml.YAMLError) -> str:
    """One line: ``line L, column C: problem`` (PyYAML's own ``str()`` spans four lines).

    The product's config loader words it the same way (``gpumetrics.yamlfile``); the two are
    kept apart because the simulator must not import the product.
    """
    mark = getattr(err, "problem_mark", None)
    problem = getattr(err, "problem", None) or " ".join(str(err).split())
    return f"line {mark.line + 1}, column {mark.column + 1}: {problem}" if mark else problem


def _read_yaml(path: Path, source: str) -> Any:
    try:
        data = path.read_bytes()
    except OSError as err:
        raise ScenarioError(source, [("", f"cannot read: {err.strerror or err}")]) from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data[: err.start].count(b"\n") + 1
        where = f"byte 0x{data[err.start]:02x} at offset {err.start}, line {line}"
        raise ScenarioError(source, [("", f"not valid UTF-8 ({where})")]) from None
    try:
        return yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as err:
        raise ScenarioError(source, [("", f"not valid YAML: {_yaml_problem(err)}")]) from None
    except RecursionError:  # PyYAML's parser recurses once per nesting level
        raise ScenarioError(source, [("", "not valid YAML: nested too deeply")]) from None


def load_scenario(source: str | os.PathLike[str] | Scenario) -> Scenario:
    """Load a scenario from a YAML file path, a built-in profile or a field-case name.

    A string without a path separator or ``.yaml``/``.yml`` suffix that is not an existing
    file is looked up among :func:`list_profiles`, then :func:`list_field_cases`. A
    :class:`Scenario` is returned as is.

    Raises:
        ScenarioError: unreadable file, invalid YAML, unknown name, or invalid content
            (each offending field named by path).

    """
    if isinstance(source, Scenario):
        return source
    text = os.fspath(source)
    path = Path(text)
    looks_like_name = (
        os.sep not in text and "/" not in text and path.suffix not in (".yaml", ".yml")
    )
    if looks_like_name and not path.is_file():
        found = _data_path(_PROFILE_PACKAGE, text) or _data_path(_FIELD_CASE_PACKAGE, text)
        if found is None:
            raise _unknown(text)
        path = found
    return scenario_from_data(_read_yaml(path, text), source=text)


def scenario_json_schema() -> str:
    """Return the JSON Schema (2020-12, from the pydantic model) of scenario files, as JSON."""
    schema = Scenario.model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "nvmlsim scenario (simulated NVML driver)"
    return json.dumps(schema, indent=2, sort_keys=True)
