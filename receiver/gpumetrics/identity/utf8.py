r"""The one rule for bytes that are not UTF-8 on their way into an OTLP string.

An OTLP ``string`` (a protobuf ``string``) must be UTF-8, but what a process shows in procfs need
not be: an environment value such as ``caf\xe9`` (Latin-1), an executable path with a Latin-1
file name. The OpenTelemetry eBPF profiler puts such bytes into its profile resources verbatim
(Go strings hold any bytes), which the wire cannot carry. Both sides of the join apply the same
rule, so the GPU resource still equals the profile resource as declared:

    every maximal run of bytes that are not part of a valid UTF-8 sequence is replaced by one
    U+FFFD REPLACEMENT CHARACTER; valid sequences (a genuine U+FFFD included) are kept.

That is Go's ``strings.ToValidUTF8(s, "\uFFFD")`` (https://pkg.go.dev/strings#ToValidUTF8),
which the Collector's ``gpumetrics`` exporter applies to every string of a profile resource it
declares (``collector/pkg/declarer``), and :func:`to_valid_utf8` here, which the sidecar applies
to what it reads from procfs for the same keys. Valid UTF-8 is RFC 3629's (no surrogates, no
overlong forms, nothing above U+10FFFF), the same set in Go and Python. The shared test vectors
are ``tests/testdata/identity/invalid_utf8_cases.json``.
"""

from __future__ import annotations

import re

__all__ = ["REPLACEMENT", "to_valid_utf8"]

REPLACEMENT = "\ufffd"
"""U+FFFD REPLACEMENT CHARACTER."""

# surrogateescape maps each byte that is not part of a valid sequence to U+DC80..U+DCFF, one per
# byte; valid UTF-8 never decodes to a lone surrogate, so these are exactly the invalid bytes.
_ESCAPED_RUN = re.compile("[\udc80-\udcff]+")


def to_valid_utf8(raw: bytes) -> tuple[str, bool]:
    r"""Decode ``raw`` as UTF-8, each maximal run of invalid bytes replaced by one U+FFFD.

    Returns:
        ``(text, replaced)``: ``replaced`` is True when ``raw`` was not valid UTF-8.

    Examples:
        >>> to_valid_utf8(b"caf\xe9")
        ('caf�', True)
        >>> to_valid_utf8(b"a\xff\xfeb")
        ('a�b', True)
        >>> to_valid_utf8("é".encode())
        ('é', False)

    """
    try:
        return raw.decode("utf-8"), False
    except UnicodeDecodeError:
        escaped = raw.decode("utf-8", "surrogateescape")
        return _ESCAPED_RUN.sub(REPLACEMENT, escaped), True
