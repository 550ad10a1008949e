"""Bearer tokens: read from files, one set for pulling and one for declaring.

A caller sends ``authorization: Bearer <token>``. Each service has an :class:`AuthPolicy`
(``docs/security.md``): the pull service wants a pull token, the profiler service a declare
token, health wants nothing (the kubelet cannot send tokens), reflection and any other service
want either. A token of the other kind gets PERMISSION_DENIED; no token or an unknown one gets
UNAUTHENTICATED. A policy whose token set is empty lets every caller through (the listener's
reach, unix socket mode and TLS are then the only protection). Tokens are compared with
``hmac.compare_digest`` against every configured token, so timing does not reveal which one
(or how much of one) matched.
"""

from __future__ import annotations

import enum
import hmac
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import grpc

from gpumetrics.service.errors import SettingError

MIN_TOKEN_LENGTH = 16
"""Shortest accepted token (characters), so a guessable word is refused at start-up."""


class AuthPolicy(enum.Enum):
    """Which token a service requires."""

    NONE = "none"
    """No token (health)."""
    PULL = "pull"
    """A pull token (``MetricsPullService``)."""
    DECLARE = "declare"
    """A declare token (``ProfilerIntegrationService``)."""
    ANY = "any"
    """Either kind (reflection, go-plugin services, anything not listed)."""


def read_token_file(path: str | Path, field: str) -> tuple[str, ...]:
    """Read tokens from ``path``: one per line; blank lines and lines starting with ``#`` skipped.

    Several lines allow rotation (old and new token both accepted for a while).

    Raises:
        SettingError: naming ``field`` when the file cannot be read, holds no token, or a token
            is shorter than :data:`MIN_TOKEN_LENGTH` or contains whitespace.

    """
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise SettingError(field, f"cannot read {str(path)!r}: {reason}") from None
    tokens = []
    for n, line in enumerate(text.splitlines(), start=1):
        token = line.strip()
        if not token or token.startswith("#"):
            continue
        if len(token) < MIN_TOKEN_LENGTH or any(ch.isspace() for ch in token):
            raise SettingError(
                field,
                f"line {n} of {str(path)!r}: a token must be at least "
                f"{MIN_TOKEN_LENGTH} characters without whitespace",
            )
        tokens.append(token)
    if not tokens:
        raise SettingError(field, f"{str(path)!r} holds no token")
    return tuple(tokens)


def _matches(candidate: bytes, tokens: Sequence[bytes]) -> bool:
    found = False
    for token in tokens:  # no early exit: every token is compared
        found |= hmac.compare_digest(candidate, token)
    return found


@dataclass(frozen=True)
class Denial:
    """Why a call is refused: the gRPC status and a message that names no secret."""

    code: grpc.StatusCode
    message: str
    reason: str
    """``unauthenticated`` or ``permission_denied`` (the self-telemetry attribute)."""


class TokenAuth:
    """Checks the bearer token of a call against the configured pull and declare tokens.

    Args:
        pull_tokens: tokens that may pull (empty: pulling needs no token).
        declare_tokens: tokens that may declare (empty: declaring needs no token).

    Raises:
        SettingError: naming ``declare_token_file`` when a token is in both sets (its kind
            would be ambiguous).

    """

    def __init__(self, pull_tokens: Iterable[str] = (), declare_tokens: Iterable[str] = ()) -> None:
        self._pull = tuple(t.encode() for t in pull_tokens)
        self._declare = tuple(t.encode() for t in declare_tokens)
        if set(self._pull) & set(self._declare):
            raise SettingError(
                "declare_token_file",
                "a token is also in pull_token_file; pulling and declaring need distinct tokens",
            )

    @property
    def enabled(self) -> bool:
        """True when at least one token is configured."""
        return bool(self._pull or self._declare)

    def check(
        self, policy: AuthPolicy, metadata: Iterable[tuple[str, str | bytes]]
    ) -> Denial | None:
        """Return None when the call may proceed under ``policy``, else the :class:`Denial`."""
        if policy is AuthPolicy.NONE:
            return None
        wanted = {
            AuthPolicy.PULL: (self._pull, self._declare, "pull"),
            AuthPolicy.DECLARE: (self._declare, self._pull, "declare"),
            AuthPolicy.ANY: (self._pull + self._declare, (), "pull or declare"),
        }[policy]
        accepted, other, kind = wanted
        if not accepted:
            return None
        token = _bearer(metadata)
        if token is None:
            return Denial(
                grpc.StatusCode.UNAUTHENTICATED,
                f"missing 'authorization: Bearer <token>' metadata (a {kind} token is required)",
                "unauthenticated",
            )
        if _matches(token, accepted):
            return None
        if other and _matches(token, other):
            return Denial(
                grpc.StatusCode.PERMISSION_DENIED,
                f"this token may not call this service (a {kind} token is required)",
                "permission_denied",
            )
        return Denial(grpc.StatusCode.UNAUTHENTICATED, "invalid bearer token", "unauthenticated")


def _bearer(metadata: Iterable[tuple[str, str | bytes]]) -> bytes | None:
    for key, value in metadata or ():
        if key == "authorization" and isinstance(value, str):
            scheme, _, token = value.strip().partition(" ")
            if scheme.lower() == "bearer" and token.strip():
                return token.strip().encode()
    return None
