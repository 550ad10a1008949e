"""Reading the YAML files a user writes (sidecar config, relabel rules): one-line problems.

Every reader of a user's YAML file reports the same three failures the same way, on one line
(docs/configuration.md, "one line per problem"):

* bytes that are not UTF-8: ``not valid UTF-8 (byte 0xff at offset 34, line 3)``;
* a syntax error: ``line 2, column 1: expected the node content, but found '<stream end>'``
  (PyYAML's ``str()`` of the error spans four lines and names ``<unicode string>``);
* a key written twice in one mapping: ``line 3, column 3: duplicate key 'interval_s' (first at
  line 2)``. PyYAML keeps the last silently; Go's ``yaml.v3`` and the Collector's confmap refuse
  it ("mapping key already defined"), and so do we.

The simulated driver's scenario loader (``nvmlsim.loader``) keeps its own copy of these few
lines: the product must not be imported by the simulator, nor the simulator by the product.
"""

from __future__ import annotations

from typing import Any

import yaml

__all__ = ["UniqueKeyLoader", "decode_utf8", "utf8_problem", "yaml_problem"]


class UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing a key written twice in one mapping.

    Keys merged in with ``<<: *anchor`` may still be overridden by the mapping's own keys
    (YAML merge-key semantics).
    """


def _construct_mapping(loader: UniqueKeyLoader, node: yaml.MappingNode) -> dict[Any, Any]:
    first: dict[Any, int] = {}
    for key_node, _ in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge":
            continue
        key = loader.construct_object(key_node, deep=True)
        try:
            seen = first.get(key)
        except TypeError:  # an unhashable key: the constructor below reports it
            continue
        if seen is not None:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r} (first at line {seen})", key_node.start_mark
            )
        first[key] = key_node.start_mark.line + 1
    return loader.construct_mapping(node, deep=True)


UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def yaml_problem(exc: yaml.YAMLError) -> str:
    """One line for a PyYAML error: ``line L, column C: problem`` (1-based, as editors count).

    >>> try:
    ...     yaml.safe_load("a: [")
    ... except yaml.YAMLError as e:
    ...     yaml_problem(e)
    "line 1, column 5: expected the node content, but found '<stream end>'"
    """
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or " ".join(str(exc).split())
    if mark is None:
        return problem
    return f"line {mark.line + 1}, column {mark.column + 1}: {problem}"


def utf8_problem(exc: UnicodeDecodeError) -> str:
    r"""``not valid UTF-8 (byte 0xff at offset 34, line 3)``: the first bad byte, 0-based offset.

    >>> try:
    ...     b"a: 1\n\xff".decode("utf-8")
    ... except UnicodeDecodeError as e:
    ...     utf8_problem(e)
    'not valid UTF-8 (byte 0xff at offset 5, line 2)'
    """
    line = exc.object[: exc.start].count(b"\n") + 1
    return (
        f"not valid UTF-8 (byte 0x{exc.object[exc.start]:02x} at offset {exc.start}, line {line})"
    )


def decode_utf8(data: bytes) -> str:
    """Decode a file's bytes as UTF-8.

    Raises:
        ValueError: the bytes are not UTF-8; the message is :func:`utf8_problem`'s.

    """
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(utf8_problem(exc)) from None
