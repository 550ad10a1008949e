"""Property tests: relabel configs, scenario files and sidecar config files.

Each loader gets (a) valid documents with random mutations (a value replaced by junk, a key
deleted, an unknown key added), (b) structured random documents and (c) raw text. Every input
loads, or fails with the loader's own error whose message names the offending field or the
file; never another exception. Inputs that do load are then used: relabel rules are applied to
random label sets, a scenario is installed and collected from twice (the simulator must record
no ``internal_error``), and a sidecar configuration builds a ``SidecarServer`` settings object.
"""

from __future__ import annotations

import copy
import math
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from gpumetrics.config import ConfigError, SidecarConfig, load_config
from gpumetrics.identity import RelabelConfigError, load_relabel_configs, relabel
from gpumetrics.metrics.producer import Producer
from gpumetrics.nvml.collector import Collector
from gpumetrics.nvml.settings import CollectionSettings
from hypothesis import given
from hypothesis import strategies as st

import nvmlsim as sim

from .conftest import hypothesis_settings

ROOT = Path(__file__).resolve().parents[2]
PARCA_CONFIG = ROOT / "tests" / "testdata" / "identity" / "parca_kubernetes_config.yaml"
SAMPLE_CONFIG = ROOT / "examples" / "gpumetrics.yaml"

junk = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.sampled_from([0, -1, 1, 0o600, 2**31, 2**64]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
    st.sampled_from(["", "0600", "1e999", "nan", "unix:///x", "(", "$1", "${", "OTEL_X"]),
    st.lists(st.text(max_size=4), max_size=3),
    st.dictionaries(st.text(max_size=4), st.integers(), max_size=2),
)
raw_text = st.one_of(
    st.text(max_size=200),
    st.text(alphabet=st.sampled_from("-:{}[]&*!|>'\"#% \n\tab1.\x00\\"), max_size=120),
)

_GPU_UUID = "GPU-11111111-2222-4333-8444-555555555555"
"""A GPU UUID of NVML's shape (nvmlsim refuses any other)."""


def _paths(tree: Any, prefix: tuple = ()) -> list[tuple]:
    out = [prefix]
    if isinstance(tree, dict):
        for k, v in tree.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(tree, list):
        for i, v in enumerate(tree):
            out += _paths(v, (*prefix, i))
    return out


@st.composite
def mutated(draw: st.DrawFn, base: Any) -> Any:
    """``base`` with 1–3 random mutations: perturb a number within plausible bounds, replace a
    value with junk, delete an entry, or add a key."""
    tree = copy.deepcopy(base)
    for _ in range(draw(st.integers(1, 3))):
        paths = _paths(tree)
        path = draw(st.sampled_from(paths))
        op = draw(st.sampled_from(["perturb", "perturb", "replace", "delete", "add"]))
        if not path:
            if op == "replace":
                tree = draw(junk)
            continue
        parent = tree
        for p in path[:-1]:
            parent = parent[p]
        last = path[-1]
        value = parent[last]
        if op == "perturb" and isinstance(value, int) and not isinstance(value, bool):
            parent[last] = draw(st.integers(0, max(1, 2 * abs(value))))
        elif op == "perturb" and isinstance(value, float):
            parent[last] = draw(st.floats(0, max(1.0, 2 * abs(value)), allow_nan=False))
        elif op in ("replace", "perturb"):
            parent[last] = draw(junk)
        elif op == "delete":
            del parent[last]
        elif isinstance(parent[last], dict):
            parent[last][draw(st.text(min_size=1, max_size=8))] = draw(junk)
        else:
            parent[last] = draw(junk)
    return tree


def _dump(tree: Any) -> str:
    return yaml.safe_dump(tree, allow_unicode=True, sort_keys=False)


# -- relabel configs -------------------------------------------------------------------------

ACTIONS = [
    "replace",
    "keep",
    "drop",
    "keepequal",
    "dropequal",
    "hashmod",
    "labelmap",
    "labeldrop",
    "labelkeep",
    "lowercase",
    "uppercase",
    "Replace",
    "KEEP",
    "nope",
    "",
]
REGEXES = [
    "(.*)",
    "a|b",
    "(",
    "(?P<a>x)(?P<a>y)",
    "\\C",
    "a{1001}",
    "(?=x)",
    "\\pL+",
    "[[:alpha:]]",
    "(?i)X",
    "\\Q.*\\E",
    "x*",
    "",
    "(?<n>.)",
]
LABELS = ["__meta_process_pid", "comm", "node", "__meta_env_var_OTEL_SERVICE_NAME", "a", "", "é"]

rule = st.fixed_dictionaries(
    {},
    optional={
        "action": st.sampled_from(ACTIONS),
        "source_labels": st.one_of(st.lists(st.sampled_from(LABELS), max_size=3), junk),
        "separator": st.one_of(st.sampled_from([";", "", "/"]), junk),
        "regex": st.one_of(st.sampled_from(REGEXES), st.text(max_size=8)),
        "target_label": st.one_of(st.sampled_from(LABELS + ["$1", "${n}"]), junk),
        "replacement": st.one_of(st.sampled_from(["$1", "${1}", "$$", "$n", "${", "x"]), junk),
        "modulus": st.one_of(st.integers(-3, 2**64), junk),
        "unknown_key": junk,
    },
)
label_sets = st.dictionaries(
    st.sampled_from(LABELS[:-2]) | st.text(max_size=6), st.text(max_size=6), max_size=6
)
_RELABEL_ERROR = re.compile(r"^relabel(_configs[\[.:]| configuration)")


def _relabel_case(text: str, labels: list[dict[str, str]], tried: dict[str, int]) -> None:
    try:
        configs = load_relabel_configs(text)
    except RelabelConfigError as exc:
        assert _RELABEL_ERROR.match(str(exc)), str(exc)
        tried["rejected"] += 1
        return
    tried["loaded"] += 1
    for ls in labels:
        out = relabel(ls, configs)
        assert out is None or all(isinstance(k, str) and isinstance(v, str) for k, v in out.items())


def test_relabel_configs(form, figures) -> None:
    base = yaml.safe_load(PARCA_CONFIG.read_text())
    tried = {"loaded": 0, "rejected": 0}

    @hypothesis_settings(form, scale=3)
    @given(
        text=st.one_of(
            mutated(base).map(_dump),
            st.lists(rule, max_size=4).map(lambda rules: _dump({"relabel_configs": rules})),
            raw_text,
        ),
        labels=st.lists(label_sets, max_size=3),
    )
    def run(text: str, labels: list[dict[str, str]]) -> None:
        _relabel_case(text, labels, tried)

    run()
    for k, v in tried.items():
        figures.add("bad_input", f"relabel_config.{k}", v)


@pytest.mark.parametrize(
    "text",
    [
        "&a [*a]\n",  # a rule list that contains itself
        "relabel_configs: &a [*a]\n",
        "- &r {action: keep, source_labels: *r}\n",  # a rule used as its own source_labels
        "[" * 2000 + "]" * 2000,  # nesting deeper than the YAML parser's recursion
    ],
    ids=["self_list", "self_list_in_mapping", "self_rule", "deep_nesting"],
)
def test_relabel_config_recursion_is_a_clear_error(text: str) -> None:
    with pytest.raises(RelabelConfigError, match=r"^relabel"):
        load_relabel_configs(text)


# -- scenario files --------------------------------------------------------------------------

SMALL_SCENARIO = {
    "format": 1,
    "devices": [
        {
            "uuid": _GPU_UUID,
            "name": "NVIDIA L4",
            "memory": {"total_bytes": 24152899584, "used_bytes": 2147483648},
            "power": {"usage_mw": 41000, "management_limit_mw": 72000, "enforced_limit_mw": 72000},
            "temperature_c": 44,
            "utilization": {"gpu": 35, "memory": 12},
            "processes": [
                {"pid": 4242, "name": "/usr/bin/python3", "used_memory_bytes": 2147483648}
            ],
        }
    ],
    "faults": [{"function": "nvmlDeviceGetTemperature", "device": 0, "code": "NOT_SUPPORTED"}],
}


def _scenario_case(path: Path, text: str, tried: dict[str, int]) -> None:
    path.write_text(text, encoding="utf-8")
    try:
        scenario = sim.load_scenario(path)
    except sim.ScenarioError as exc:
        assert exc.problems and all(isinstance(m, str) and m for _, m in exc.problems), exc
        assert str(path) in str(exc)
        tried["rejected"] += 1
        return
    tried["loaded"] += 1
    drv = sim.install(scenario, latency="off", max_hang_s=2)
    try:
        collector = Collector(
            Producer(),
            CollectionSettings(pid_max=2**22, call_timeout_s=1.0),
            clock_ns=lambda: drv.clock.now_us() * 1000,
            monotonic_ns=lambda: drv.clock.now_us() * 1000,
        )
        for _ in range(2):
            collector.collect_once()
            drv.next_cycle()
        assert collector.stop(2.0)
        internal = [v for v in drv.violations if v.kind == "internal_error"]
        assert not internal, internal
    finally:
        sim.uninstall()


def test_scenario_files(tmp_path: Path, form, figures) -> None:
    rich = sim.load_scenario("h100-sxm").model_dump(mode="json", exclude_none=True)
    tried = {"loaded": 0, "rejected": 0}
    path = tmp_path / "scenario.yaml"

    @hypothesis_settings(form, scale=2)
    @given(text=st.one_of(mutated(SMALL_SCENARIO).map(_dump), mutated(rich).map(_dump), raw_text))
    def run(text: str) -> None:
        _scenario_case(path, text, tried)

    run()
    for k, v in tried.items():
        figures.add("bad_input", f"scenario_file.{k}", v)


@pytest.mark.parametrize(
    "text",
    ["[" * 2000 + "]" * 2000, "format: 1\ndevices: " + "[" * 2000 + "]" * 2000],
    ids=["deep_top", "deep_devices"],
)
def test_scenario_file_nesting_is_a_clear_error(tmp_path: Path, text: str) -> None:
    path = tmp_path / "deep.yaml"
    path.write_text(text)
    with pytest.raises(sim.ScenarioError, match="invalid scenario"):
        sim.load_scenario(path)


@pytest.mark.parametrize(
    ("reading", "field"),
    [
        ("memory: {total_bytes: 100, used_bytes: .nan}", "devices[0].memory.used_bytes"),
        ("power: {usage_mw: .inf}", "devices[0].power.usage_mw"),
        ("temperature_c: {pattern: sine, min: 1, max: .inf, period_s: 2}", "temperature_c"),
    ],
    ids=["nan_used_bytes", "inf_power", "inf_in_pattern"],
)
def test_scenario_non_finite_readings_are_rejected(
    tmp_path: Path, reading: str, field: str
) -> None:
    """Found by test_scenario_files: NaN passed validation, then the simulator answered UNKNOWN
    with an internal_error violation (``cannot convert float NaN to integer``)."""
    path = tmp_path / "nan.yaml"
    path.write_text(f"format: 1\ndevices:\n- uuid: {_GPU_UUID}\n  {reading}\n")
    with pytest.raises(sim.ScenarioError) as err:
        sim.load_scenario(path)
    assert any(
        p.startswith("devices[0]") and field.split(".")[-1] in p for p, _ in err.value.problems
    )


def test_scenario_cycle_shorter_than_the_clock_resolution_is_rejected(tmp_path: Path) -> None:
    """Found by test_scenario_files (long form): ``cycle_seconds: 1e-273`` passed ``gt=0``, then
    rounded to a 0 µs cycle and every cycle computation divided by zero."""
    path = tmp_path / "tiny.yaml"
    path.write_text(
        f"format: 1\nclock: {{cycle_seconds: 1.0e-273}}\ndevices: [{{uuid: {_GPU_UUID}}}]\n"
    )
    with pytest.raises(sim.ScenarioError) as err:
        sim.load_scenario(path)
    assert [p for p, _ in err.value.problems] == ["clock.cycle_seconds"]


# -- sidecar configuration files -------------------------------------------------------------

_CONFIG_LINE = re.compile(r"^('.*'( \(from .*\))?: |config file |GPUMETRICS_[A-Z_]+=)", re.S)


def _config_case(path: Path, text: str, environ: dict[str, str], tried: dict[str, int]) -> None:
    path.write_text(text, encoding="utf-8")
    try:
        config = load_config(str(path), environ, {})
    except ConfigError as exc:
        assert exc.errors and all(_CONFIG_LINE.match(line) for line in exc.errors), exc.errors
        tried["rejected"] += 1
        return
    assert isinstance(config, SidecarConfig)
    assert math.isfinite(config.runtime.batch_interval_s)
    tried["loaded"] += 1


ENV_NAMES = [
    "GPUMETRICS_LISTEN",
    "GPUMETRICS_BATCH_INTERVAL_S",
    "GPUMETRICS_STORE_MAX_BYTES",
    "GPUMETRICS_IN_KUBERNETES",
    "GPUMETRICS_PUSH_HEADERS",
    "GPUMETRICS_DISABLED_METRICS",
    "GPUMETRICS_LOG_LEVEL",
    "GPUMETRICS_PLUGIN_TRANSPORT",
    "GPUMETRICS_PROC_ROOT",
]


def test_config_files_and_environment(tmp_path: Path, form, figures) -> None:
    base = yaml.safe_load(SAMPLE_CONFIG.read_text())
    tried = {"loaded": 0, "rejected": 0}
    path = tmp_path / "gpumetrics.yaml"

    @hypothesis_settings(form, scale=2)
    @given(
        text=st.one_of(mutated(base).map(_dump), raw_text),
        environ=st.dictionaries(
            st.sampled_from(ENV_NAMES),
            st.text(max_size=12).filter(lambda s: "\0" not in s),
            max_size=2,
        ),
    )
    def run(text: str, environ: dict[str, str]) -> None:
        _config_case(path, text, environ, tried)

    run()
    for k, v in tried.items():
        figures.add("bad_input", f"config_file.{k}", v)


@pytest.mark.parametrize(
    "text",
    ["[" * 2000 + "]" * 2000, "server: {listen: " + "[" * 2000 + "]" * 2000 + "}"],
    ids=["deep_top", "deep_value"],
)
def test_config_file_nesting_is_a_clear_error(tmp_path: Path, text: str) -> None:
    path = tmp_path / "deep.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=r"config file .*deep\.yaml"):
        load_config(str(path), {}, {})
