"""How much memory a decoded declaration holds, estimated from the objects themselves.

The declared store is bounded by bytes *held*, not bytes received: a 64 KiB ``profiler_resource``
of many short attributes decodes into dictionaries several times its wire size (issue 11: 1.54 MB
of RSS per 197 KB declaration). :func:`declared_bytes` walks a :class:`Declared` and adds up
``sys.getsizeof`` of every container, key and value it reaches, each object once, plus
:data:`ENTRY_OVERHEAD_BYTES` for the store's own bookkeeping of the entry.

``sys.getsizeof`` reports an object's own allocation as CPython sees it; the allocator rounds
small blocks up to 16 bytes, and attribute names are interned (``sys.intern``), which costs a
slot in the interpreter's table of interned strings per new name, neither of which the walk
sees; :data:`ALLOCATOR_FACTOR` and :data:`INTERNED_KEY_BYTES` stand for them.
``python -m benchmarks.hardening_bench calibrate`` measures the real cost with
``tracemalloc`` for typical and maximal declarations of several shapes: its figures (in
``docs/performance.md``) set those two, so that the estimate does not undercount what
``tracemalloc`` sees. Names shared between declarations (real attribute names) are counted in
every declaration that holds them, so for typical declarations the estimate is on the high
side.
"""

from __future__ import annotations

import sys
from typing import Any

__all__ = [
    "ALLOCATOR_FACTOR",
    "ENTRY_OVERHEAD_BYTES",
    "INTERNED_KEY_BYTES",
    "declared_bytes",
    "deep_size",
]

ENTRY_OVERHEAD_BYTES = 256
"""The store's bookkeeping per entry (By): its ``OrderedDict`` slot and key, the entry record and
the ``Declared`` instance's own fields beyond what :func:`deep_size` reaches."""

ALLOCATOR_FACTOR = 1.1
"""Multiplier for the allocator's rounding of small blocks, which ``sys.getsizeof`` cannot see."""

INTERNED_KEY_BYTES = 32
"""Charge per attribute name (By) for its slot in the interpreter's table of interned strings
(about 24 bytes measured per new name, plus the table's growth slack)."""

_ATOMS = (str, bytes, int, float, bool, type(None))


def deep_size(obj: Any, per_key: int = 0) -> int:
    """Return the summed ``sys.getsizeof`` of ``obj`` and everything it holds (By).

    Follows dicts (keys and values), lists, tuples, sets and objects with ``__slots__``; counts
    each object once (shared objects, such as interned names, are counted where first seen),
    plus ``per_key`` for every dict key. Iterative, so deeply nested attribute values cannot
    exhaust the stack.
    """
    seen: set[int] = set()
    stack = [obj]
    total = 0
    while stack:
        o = stack.pop()
        if id(o) in seen:
            continue
        seen.add(id(o))
        total += sys.getsizeof(o)
        if isinstance(o, _ATOMS):
            continue
        if isinstance(o, dict):
            total += per_key * len(o)
            stack.extend(o.keys())
            stack.extend(o.values())
        elif isinstance(o, (list, tuple, set, frozenset)):
            stack.extend(o)
        else:
            for name in getattr(type(o), "__slots__", ()):
                value = getattr(o, name, None)
                if value is not None:
                    stack.append(value)
    return total


def declared_bytes(declared: Any) -> int:
    """Estimate the memory (By) the declared store holds for one ``Declared`` entry."""
    return int(deep_size(declared, INTERNED_KEY_BYTES) * ALLOCATOR_FACTOR) + ENTRY_OVERHEAD_BYTES
