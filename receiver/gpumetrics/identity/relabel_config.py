r"""Prometheus ``relabel_configs``: parsing, defaults and validation (Prometheus 3.x rules).

Source: Prometheus ``model/relabel/relabel.go`` (3.x, the version parca-agent v0.49 pins;
https://github.com/prometheus/prometheus/blob/main/model/relabel/relabel.go) and its
``relabel_config`` documentation
(https://prometheus.io/docs/prometheus/latest/configuration/configuration/#relabel_config).
A parca-agent configuration file (top-level
``relabel_configs:``, other top-level keys being the agent's flags) loads unchanged.

Defaults: ``action: replace``, ``separator: ";"``, ``regex: "(.*)"``, ``replacement: "$1"``.
A key given as YAML null takes Go's zero value (``""``; ``regex: ~`` is the empty regex).
``action`` is matched case-insensitively. Label names follow Prometheus 3's UTF-8 validation
scheme (the default of prometheus/common v0.63, which parca-agent uses): any non-empty string.

Regexes are fully anchored as Prometheus 3 does, ``^(?s:<regex>)$``, and compiled with RE2
(``google-re2``), the engine whose syntax Go's ``regexp`` implements. Differences we guard
against: RE2 C++ accepts ``\C`` (any byte), Go does not, so it is rejected; RE2 rejects
duplicate group names, which Go accepts (such a config fails here with the RE2 message).

Deliberate difference: unknown keys in a rule are an error naming the key (Prometheus' strict
loader does the same; parca-agent's lenient ``yaml.Unmarshal`` silently ignores them, which
hides typos).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import yaml

from gpumetrics.yamlfile import decode_utf8, yaml_problem


class RelabelConfigError(ValueError):
    """A relabel rule is invalid.

    The message names it, e.g. ``relabel_configs[2].target_label: required for action replace``.
    """


class Action(enum.Enum):
    """Relabel actions (Prometheus ``relabel.Action``)."""

    REPLACE = "replace"
    KEEP = "keep"
    DROP = "drop"
    KEEPEQUAL = "keepequal"
    DROPEQUAL = "dropequal"
    HASHMOD = "hashmod"
    LABELMAP = "labelmap"
    LABELDROP = "labeldrop"
    LABELKEEP = "labelkeep"
    LOWERCASE = "lowercase"
    UPPERCASE = "uppercase"


DEFAULT_SEPARATOR = ";"
DEFAULT_REGEX = "(.*)"
DEFAULT_REPLACEMENT = "$1"
_FIELDS = (
    "source_labels",
    "separator",
    "regex",
    "modulus",
    "target_label",
    "replacement",
    "action",
)
_U64_MAX = 2**64 - 1


class AnchoredRegex:
    r"""An RE2 regex anchored as Prometheus 3 anchors it: ``^(?s:<pattern>)$``.

    Raises:
        ValueError: the pattern does not compile (RE2's message) or uses ``\C``.

    """

    __slots__ = ("pattern", "_re", "_names")

    def __init__(self, pattern: str) -> None:
        import re2  # google-re2 only where relabel rules are configured (RSS, docs/performance.md)

        _reject_any_byte(pattern)
        options = re2.Options()
        options.log_errors = False
        try:
            self._re = re2.compile(f"^(?s:{pattern})$", options)
        except re2.error as exc:
            detail = exc.args[0] if exc.args else exc
            if isinstance(detail, bytes):
                detail = detail.decode("utf-8", "replace")
            raise ValueError(f"invalid regex {pattern!r}: {detail}") from None
        except UnicodeEncodeError:
            raise ValueError(f"invalid regex {pattern!r}: not valid UTF-8") from None
        self.pattern = pattern
        self._names: dict[str, int] = dict(self._re.groupindex)

    @property
    def group_names(self) -> Mapping[str, int]:
        """Named groups → group index."""
        return self._names

    @property
    def groups(self) -> int:
        """Number of capturing groups."""
        return int(self._re.groups)

    def spans(self, text: str) -> list[tuple[int, int]] | None:
        """Return the spans of groups 0..n when ``text`` matches, else None.

        A group that did not participate has span ``(-1, -1)``.
        """
        m = self._re.search(text)
        if m is None:
            return None
        return [m.span(i) for i in range(self.groups + 1)]

    def matches(self, text: str) -> bool:
        """Whether ``text`` matches (the whole of it)."""
        return self._re.search(text) is not None


def _reject_any_byte(pattern: str) -> None:
    i = 0
    while i < len(pattern):
        if pattern[i] == "\\":
            if pattern[i + 1 : i + 2] == "C":
                raise ValueError(f"invalid regex {pattern!r}: \\C is not supported (Go regexp)")
            i += 2
        else:
            i += 1


@dataclass(frozen=True, slots=True)
class RelabelConfig:
    """One validated relabel rule (Prometheus ``relabel.Config``)."""

    action: Action = Action.REPLACE
    source_labels: tuple[str, ...] | None = None
    separator: str = DEFAULT_SEPARATOR
    regex: AnchoredRegex = field(default_factory=lambda: AnchoredRegex(DEFAULT_REGEX))
    regex_set: bool = False
    """Whether ``regex`` was given (Prometheus compares the default by identity)."""
    modulus: int = 0
    target_label: str = ""
    replacement: str = DEFAULT_REPLACEMENT


def _string(value: Any, path: str) -> str:
    if value is None:
        return ""
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise RelabelConfigError(f"{path}: must be a string, got {type(value).__name__}")
    return value if isinstance(value, str) else str(value)


def _source_labels(value: Any, path: str) -> tuple[str, ...] | None:
    if value is None:
        return None
    if not isinstance(value, list):
        raise RelabelConfigError(f"{path}: must be a list of label names")
    names = tuple(_string(v, f"{path}[{i}]") for i, v in enumerate(value))
    for i, name in enumerate(names):
        if not name:
            raise RelabelConfigError(f"{path}[{i}]: empty label name")
    return names


def parse_relabel_config(raw: Any, path: str) -> RelabelConfig:
    """Parse and validate one rule (a YAML mapping) found at ``path``.

    Raises:
        RelabelConfigError: naming ``path`` and the field.

    """
    if not isinstance(raw, Mapping):
        raise RelabelConfigError(f"{path}: must be a mapping")
    for key in raw:
        if key not in _FIELDS:
            raise RelabelConfigError(f"{path}.{key}: unknown field")
    action_s = _string(raw.get("action", Action.REPLACE.value), f"{path}.action").lower()
    if not action_s:
        raise RelabelConfigError(f"{path}.action: must not be empty")
    try:
        action = Action(action_s)
    except ValueError:
        raise RelabelConfigError(f"{path}.action: unknown relabel action {action_s!r}") from None
    regex_set = "regex" in raw
    regex_s = _string(raw["regex"], f"{path}.regex") if regex_set else DEFAULT_REGEX
    try:
        regex = AnchoredRegex(regex_s)
    except ValueError as exc:
        raise RelabelConfigError(f"{path}.regex: {exc}") from None
    modulus = raw.get("modulus", 0)
    if modulus is None:
        modulus = 0
    if isinstance(modulus, str):
        try:
            modulus = int(modulus, 0)
        except ValueError:
            raise RelabelConfigError(f"{path}.modulus: must be an integer in 0..2^64-1") from None
    if isinstance(modulus, bool) or not isinstance(modulus, int) or not 0 <= modulus <= _U64_MAX:
        raise RelabelConfigError(f"{path}.modulus: must be an integer in 0..2^64-1")
    cfg = RelabelConfig(
        action=action,
        source_labels=_source_labels(raw.get("source_labels"), f"{path}.source_labels"),
        separator=_string(raw.get("separator", DEFAULT_SEPARATOR), f"{path}.separator"),
        regex=regex,
        regex_set=regex_set,
        modulus=modulus,
        target_label=_string(raw.get("target_label", ""), f"{path}.target_label"),
        replacement=_string(raw.get("replacement", DEFAULT_REPLACEMENT), f"{path}.replacement"),
    )
    _validate(cfg, path)
    return cfg


def _validate(c: RelabelConfig, path: str) -> None:
    a = c.action
    name = a.value
    if a is Action.HASHMOD and c.modulus == 0:
        raise RelabelConfigError(f"{path}.modulus: must be > 0 for action hashmod")
    needs_target = (
        Action.REPLACE,
        Action.HASHMOD,
        Action.LOWERCASE,
        Action.UPPERCASE,
        Action.KEEPEQUAL,
        Action.DROPEQUAL,
    )
    if a in needs_target and not c.target_label:
        raise RelabelConfigError(f"{path}.target_label: required for action {name}")
    if a is Action.LABELMAP and not c.replacement:
        raise RelabelConfigError(f"{path}.replacement: must be a label name for action labelmap")
    fixed_replacement = (Action.LOWERCASE, Action.UPPERCASE, Action.KEEPEQUAL, Action.DROPEQUAL)
    if a in fixed_replacement and c.replacement != DEFAULT_REPLACEMENT:
        raise RelabelConfigError(f"{path}.replacement: cannot be set for action {name}")
    if a in (Action.KEEPEQUAL, Action.DROPEQUAL):
        if c.regex_set:
            raise RelabelConfigError(f"{path}.regex: not allowed for action {name}")
        if c.modulus:
            raise RelabelConfigError(f"{path}.modulus: not allowed for action {name}")
        if c.separator != DEFAULT_SEPARATOR:
            raise RelabelConfigError(f"{path}.separator: not allowed for action {name}")
    if a in (Action.LABELDROP, Action.LABELKEEP):
        if c.source_labels is not None:
            raise RelabelConfigError(f"{path}.source_labels: not allowed for action {name}")
        if c.target_label:
            raise RelabelConfigError(f"{path}.target_label: not allowed for action {name}")
        if c.modulus:
            raise RelabelConfigError(f"{path}.modulus: not allowed for action {name}")
        if c.separator != DEFAULT_SEPARATOR:
            raise RelabelConfigError(f"{path}.separator: not allowed for action {name}")
        if c.replacement != DEFAULT_REPLACEMENT:
            raise RelabelConfigError(f"{path}.replacement: not allowed for action {name}")


def parse_relabel_configs(raw: Any, path: str = "relabel_configs") -> tuple[RelabelConfig, ...]:
    """Parse a list of rules (None = no rules).

    Raises:
        RelabelConfigError: naming the rule index and field.

    """
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise RelabelConfigError(f"{path}: must be a list of relabel rules")
    return tuple(parse_relabel_config(item, f"{path}[{i}]") for i, item in enumerate(raw))


def load_relabel_configs(text: str | bytes) -> tuple[RelabelConfig, ...]:
    """Load rules from YAML text.

    The text is a parca-agent config file (a mapping with ``relabel_configs``; its other
    top-level keys are ignored) or a bare list of rules.

    Scalars are taken as their literal text, as Go's YAML decoder does for string fields
    (PyYAML alone would turn ``regex: yes`` into a boolean).

    Raises:
        RelabelConfigError: invalid YAML (including nesting too deep to parse and aliases that
            refer to themselves), or an invalid rule (named).

    """
    if isinstance(text, bytes):
        try:
            text = decode_utf8(text)
        except ValueError as exc:
            raise RelabelConfigError(f"relabel configuration: {exc}") from None
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        doc = _plain(node, "relabel configuration") if node is not None else None
    except yaml.YAMLError as exc:
        raise RelabelConfigError(
            f"relabel configuration: invalid YAML: {yaml_problem(exc)}"
        ) from None
    except RecursionError:  # PyYAML and _plain recurse: deep nesting or a self-referring alias
        raise RelabelConfigError(
            "relabel configuration: nested too deeply, or a YAML alias refers to itself"
        ) from None
    if doc is None:
        return ()
    if isinstance(doc, Mapping):
        return parse_relabel_configs(doc.get("relabel_configs"))
    return parse_relabel_configs(doc)


_NULL_TAG = "tag:yaml.org,2002:null"


def _plain(node: yaml.Node, path: str) -> Any:
    """Turn a composed YAML node into dicts, lists, str and None (scalars stay text)."""
    if isinstance(node, yaml.MappingNode):
        out: dict[str, Any] = {}
        for key_node, value_node in node.value:
            key = key_node.value if isinstance(key_node, yaml.ScalarNode) else None
            if not isinstance(key, str):
                raise RelabelConfigError(f"{path}: mapping keys must be scalars")
            if key in out:
                raise RelabelConfigError(f"{path}.{key}: duplicate key")
            out[key] = _plain(value_node, f"{path}.{key}")
        return out
    if isinstance(node, yaml.SequenceNode):
        return [_plain(item, f"{path}[{i}]") for i, item in enumerate(node.value)]
    if node.tag == _NULL_TAG:
        return None
    return node.value
