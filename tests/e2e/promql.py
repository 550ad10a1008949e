"""The Grafana dashboard's PromQL, evaluated by a real Prometheus (its HTTP API, ``/api/v1``).

:func:`dashboard_queries` reads every panel target's ``expr`` of a dashboard file (Grafana's
built-in interval variables replaced by what Grafana would send; any other ``$variable`` fails,
since this test could not know its value). :func:`evaluate` runs one instant query
(``GET /api/v1/query``) and says what is wrong with it: Prometheus' own error (a syntax error, an
unknown function, a bad matcher) or an empty result. A panel that shows only series crossing a
threshold (``hw_network_up == 0``, ``increase(...) > 0``) is empty on a healthy node, so such a
query is evaluated with its comparison turned into ``bool`` (``== bool 0``): every series it
would show once the threshold is crossed must exist.
"""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

# Grafana's built-in variables, as Grafana would expand them for a short time range.
GRAFANA_VARIABLES = {
    "$__rate_interval": "1m",
    "$__interval": "15s",
    "$__range": "5m",
    "${__rate_interval}": "1m",
    "${__interval}": "15s",
    "${__range}": "5m",
}
_THRESHOLD = re.compile(r"^(?P<lhs>.*\S)\s*(?P<op>==|!=|>=|<=|>|<)\s*(?P<num>-?[0-9.]+)\s*$", re.S)


def dashboard_queries(path: Path) -> list[tuple[str, str]]:
    """``(panel title, expr)`` of every target of every panel (rows included) of a dashboard."""
    dashboard = json.loads(path.read_text())
    out: list[tuple[str, str]] = []

    def walk(panels: list[dict[str, Any]]) -> None:
        for panel in panels:
            for target in panel.get("targets", []):
                expr = target.get("expr")
                if expr:
                    out.append((str(panel.get("title", "?")), substitute(str(expr))))
            walk(panel.get("panels", []))

    walk(dashboard.get("panels", []))
    return out


def substitute(expr: str) -> str:
    """``expr`` with Grafana's built-in variables expanded.

    Raises:
        AssertionError: another ``$variable`` (a template variable this test cannot resolve).

    """
    for name, value in GRAFANA_VARIABLES.items():
        expr = expr.replace(name, value)
    unknown = re.findall(r"\$\{?\w+\}?", expr)
    assert not unknown, f"{expr!r}: dashboard variables {unknown} (add them to GRAFANA_VARIABLES)"
    return expr


def checked_form(expr: str) -> str:
    """The query evaluated for ``expr``: a trailing threshold comparison becomes ``bool``.

    >>> checked_form("hw_network_up == 0")
    'hw_network_up == bool 0'
    >>> checked_form("rate(x[1m])")
    'rate(x[1m])'
    """
    m = _THRESHOLD.match(expr)
    if (
        m is None
        or re.search(r"\bbool\s*$", m.group("lhs"))
        or "bool" in expr.split(m.group("op"))[-1]
    ):
        return expr
    return f"{m.group('lhs')} {m.group('op')} bool {m.group('num')}"


def evaluate(base_url: str, expr: str) -> tuple[str | None, list[dict[str, Any]]]:
    """Run ``checked_form(expr)`` as an instant query; return (what is wrong or None, result).

    Prometheus answers a bad query with HTTP 400 and ``{"status": "error", "error": ...}``; that
    error is returned as is. An empty vector is reported as such.
    """
    query = checked_form(expr)
    url = f"{base_url}/api/v1/query?" + urllib.parse.urlencode({"query": query})
    try:
        with urllib.request.urlopen(url, timeout=10) as response:  # noqa: S310 (loopback)
            body = json.loads(response.read())
    except urllib.error.HTTPError as err:
        raw = err.read()
        try:
            body = json.loads(raw or b"{}")
        except ValueError:  # e.g. 503 "Service Unavailable" while Prometheus starts
            return f"Prometheus answered HTTP {err.code}: {raw[:200]!r}", []
    except (urllib.error.URLError, ConnectionError, TimeoutError) as err:
        return f"Prometheus did not answer: {err}", []
    if body.get("status") != "success":
        return f"{body.get('errorType', 'error')}: {body.get('error', body)}", []
    result = body["data"]["result"]
    if not result:
        return f"no series (evaluated as {query!r})", []
    return None, result
