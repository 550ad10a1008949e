"""Applying Prometheus relabel rules to one process's label set (Prometheus ``relabel.Process``).

Semantics follow Prometheus 3 ``model/relabel/relabel.go`` and its ``labels.Builder``:

* The value is the ``source_labels`` values (missing = ``""``) joined by ``separator``.
* Setting a label to ``""`` deletes it (an empty label is a missing label).
* ``replace``: fast path when the value is empty, the regex is the default and neither
  ``target_label`` nor ``replacement`` contains ``$``: set the target to the literal replacement.
  Otherwise, on a match, expand ``target_label`` and ``replacement`` (Go ``Regexp.Expand``:
  ``$1``, ``${1}``, ``$name``, ``${name}``, ``$$``; ``$1x`` names group ``1x``); an empty target
  does nothing, an empty result deletes the target.
* ``keep``/``drop``/``keepequal``/``dropequal`` may drop the whole set; rules stop at the first
  drop.
* ``hashmod``: last 8 bytes of MD5(value) as a big-endian uint64, modulo ``modulus``.
* ``labelmap``/``labeldrop``/``labelkeep`` visit a snapshot of the labels in the builder's order:
  the original labels sorted by name, then those set during this pass in the order set.
* ``lowercase``/``uppercase`` use Go's per-rune simple case mapping (``strings.ToLower``), not
  Python's full mapping (``"ß".upper()`` stays ``"ß"``; no final-sigma rule).
"""

from __future__ import annotations

import hashlib
import unicodedata
from collections.abc import Mapping, Sequence

from gpumetrics.identity.relabel_config import Action, AnchoredRegex, RelabelConfig

META_PREFIX = "__meta_"


class LabelBuilder:
    """Prometheus ``labels.Builder``: original labels plus ordered additions and deletions."""

    __slots__ = ("_base", "_add", "_del")

    def __init__(self, labels: Mapping[str, str]) -> None:
        self._base = {k: v for k, v in labels.items() if v}
        self._add: dict[str, str] = {}
        self._del: set[str] = set()

    def get(self, name: str) -> str:
        """Return the current value of ``name`` (``""`` when missing)."""
        if name in self._add:
            return self._add[name]
        if name in self._del:
            return ""
        return self._base.get(name, "")

    def set(self, name: str, value: str) -> None:
        """Set ``name``; an empty ``value`` deletes it."""
        if not value:
            self.delete(name)
        else:
            self._add[name] = value

    def delete(self, name: str) -> None:
        """Delete ``name``."""
        self._add.pop(name, None)
        self._del.add(name)

    def snapshot(self) -> list[tuple[str, str]]:
        """Labels in ``Range`` order: untouched originals sorted by name, then additions."""
        added = list(self._add.items())
        out = [
            (k, self._base[k])
            for k in sorted(self._base)
            if k not in self._del and k not in self._add
        ]
        return out + added

    def labels(self) -> dict[str, str]:
        """Return the resulting label set."""
        return dict(self.snapshot())


def expand(template: str, text: str, regex: AnchoredRegex, spans: Sequence[tuple[int, int]]) -> str:
    """Expand a Go ``Regexp.Expand`` template against a match of ``regex`` on ``text``."""
    if "$" not in template:
        return template
    out: list[str] = []
    rest = template
    while True:
        before, dollar, rest = rest.partition("$")
        out.append(before)
        if not dollar:
            return "".join(out)
        if rest.startswith("$"):
            out.append("$")
            rest = rest[1:]
            continue
        parsed = _extract(rest)
        if parsed is None:
            out.append("$")
            continue
        name, num, rest = parsed
        if num >= 0:
            if num < len(spans) and spans[num][0] >= 0:
                out.append(text[spans[num][0] : spans[num][1]])
        else:
            index = regex.group_names.get(name)
            if index is not None and spans[index][0] >= 0:
                out.append(text[spans[index][0] : spans[index][1]])


def _is_name_char(ch: str) -> bool:
    cat = unicodedata.category(ch)
    return cat[0] == "L" or cat == "Nd" or ch == "_"


def _extract(s: str) -> tuple[str, int, str] | None:
    """Go ``regexp.extract``: a leading ``name`` or ``{name}``; None when malformed."""
    brace = s.startswith("{")
    if brace:
        s = s[1:]
    i = 0
    while i < len(s) and _is_name_char(s[i]):
        i += 1
    if i == 0:
        return None
    name = s[:i]
    if brace:
        if i >= len(s) or s[i] != "}":
            return None
        i += 1
    num = -1
    if name.isascii() and name.isdigit() and not (name[0] == "0" and len(name) > 1):
        num = int(name) if len(name) <= 8 else -1
    return name, num, s[i:]


def _go_case(text: str, upper: bool) -> str:
    out = []
    for ch in text:
        mapped = ch.upper() if upper else ch.lower()
        if len(mapped) != 1:
            if ch == "\u0130" and not upper:
                mapped = "i"  # simple lowercase mapping of U+0130
            else:
                titled = ch.title() if upper else ch
                mapped = titled if len(titled) == 1 else ch
        out.append(mapped)
    return "".join(out)


def _hashmod(value: str, modulus: int) -> int:
    digest = hashlib.md5(value.encode("utf-8"), usedforsecurity=False).digest()
    return int.from_bytes(digest[8:], "big") % modulus


def _apply(cfg: RelabelConfig, lb: LabelBuilder) -> bool:
    value = cfg.separator.join(lb.get(n) for n in cfg.source_labels or ())
    action = cfg.action
    if action is Action.DROP:
        return not cfg.regex.matches(value)
    if action is Action.KEEP:
        return cfg.regex.matches(value)
    if action is Action.DROPEQUAL:
        return lb.get(cfg.target_label) != value
    if action is Action.KEEPEQUAL:
        return lb.get(cfg.target_label) == value
    if action is Action.REPLACE:
        if (
            not value
            and not cfg.regex_set
            and "$" not in cfg.target_label
            and "$" not in cfg.replacement
        ):
            lb.set(cfg.target_label, cfg.replacement)
            return True
        spans = cfg.regex.spans(value)
        if spans is None:
            return True
        target = expand(cfg.target_label, value, cfg.regex, spans)
        if not target:
            return True
        result = expand(cfg.replacement, value, cfg.regex, spans)
        if result:
            lb.set(target, result)
        else:
            lb.delete(target)
    elif action is Action.LOWERCASE:
        lb.set(cfg.target_label, _go_case(value, upper=False))
    elif action is Action.UPPERCASE:
        lb.set(cfg.target_label, _go_case(value, upper=True))
    elif action is Action.HASHMOD:
        lb.set(cfg.target_label, str(_hashmod(value, cfg.modulus)))
    elif action is Action.LABELMAP:
        for name, label_value in lb.snapshot():
            spans = cfg.regex.spans(name)
            if spans is not None:
                target = expand(cfg.replacement, name, cfg.regex, spans)
                if target:  # Go would add a label with an empty name; it could not be emitted
                    lb.set(target, label_value)
    elif action is Action.LABELDROP:
        for name, _ in lb.snapshot():
            if cfg.regex.matches(name):
                lb.delete(name)
    elif action is Action.LABELKEEP:
        for name, _ in lb.snapshot():
            if not cfg.regex.matches(name):
                lb.delete(name)
    return True


def relabel(labels: Mapping[str, str], configs: Sequence[RelabelConfig]) -> dict[str, str] | None:
    """Apply ``configs`` in order to ``labels``.

    Returns:
        The resulting labels (``__meta_*`` still present), or None when a rule dropped the set.

    """
    lb = LabelBuilder(labels)
    for cfg in configs:
        if not _apply(cfg, lb):
            return None
    return lb.labels()


def strip_meta(labels: Mapping[str, str]) -> dict[str, str]:
    """Remove every ``__meta_*`` label.

    parca-agent does this after relabeling; other ``__`` labels stay.
    """
    return {k: v for k, v in labels.items() if not k.startswith(META_PREFIX)}
