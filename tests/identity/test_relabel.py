"""Prometheus-compatible relabeling: every action as data, validation errors as data, and a
parca-agent Kubernetes configuration loaded unchanged."""

from __future__ import annotations

import pytest
from gpumetrics.identity.attrs import AttrValue
from gpumetrics.identity.labels import labels_to_attributes, process_labels
from gpumetrics.identity.procfs import ProcfsReader
from gpumetrics.identity.relabel import LabelBuilder, expand, relabel, strip_meta
from gpumetrics.identity.relabel_config import (
    Action,
    AnchoredRegex,
    RelabelConfigError,
    load_relabel_configs,
    parse_relabel_configs,
)

from .conftest import PROC, TESTDATA, load_cases

CASES = load_cases("relabel_cases.yaml")
ERRORS = load_cases("relabel_errors.yaml")


@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_relabel_case(case: dict) -> None:
    rules = parse_relabel_configs(case["rules"])
    got = relabel(case["input"], rules)
    if case.get("dropped"):
        assert got is None
    else:
        assert got == case["expected"]


def test_every_action_is_covered() -> None:
    used = {str(rule.get("action", "replace")).lower() for case in CASES for rule in case["rules"]}
    assert used == {a.value for a in Action}


@pytest.mark.parametrize("case", ERRORS, ids=[c["id"] for c in ERRORS])
def test_validation_error(case: dict) -> None:
    with pytest.raises(RelabelConfigError) as err:
        parse_relabel_configs(case["rules"])
    assert str(err.value) == case["error"]


def test_defaults_are_prometheus_defaults() -> None:
    (rule,) = parse_relabel_configs([{"target_label": "t"}])
    assert rule.action is Action.REPLACE
    assert (rule.separator, rule.regex.pattern, rule.replacement) == (";", "(.*)", "$1")
    assert rule.source_labels is None and rule.modulus == 0 and not rule.regex_set


def test_yaml_null_takes_go_zero_values() -> None:
    text = "relabel_configs:\n- source_labels: [a]\n  target_label: t\n  regex:\n  separator:\n"
    (rule,) = load_relabel_configs(text)
    assert rule.regex.pattern == "" and rule.regex_set and rule.separator == ""
    assert relabel({"a": "x"}, [rule]) == {"a": "x"}  # "" matches only the empty value


def test_yaml_scalars_are_text_like_go() -> None:
    text = "- {source_labels: [a], regex: yes, target_label: t, replacement: on}\n"
    (rule,) = load_relabel_configs(text)
    assert (rule.regex.pattern, rule.replacement) == ("yes", "on")
    (hm,) = load_relabel_configs(
        "- {action: hashmod, source_labels: [a], target_label: t, modulus: 0x10}"
    )
    assert hm.modulus == 16


def test_yaml_errors_name_the_problem() -> None:
    with pytest.raises(RelabelConfigError, match="invalid YAML"):
        load_relabel_configs("relabel_configs: [")
    dup = r"relabel configuration\.relabel_configs\[0\]\.x: duplicate key"
    with pytest.raises(RelabelConfigError, match=dup):
        load_relabel_configs("relabel_configs:\n- {x: 1, x: 2}\n")
    with pytest.raises(RelabelConfigError, match=r"^relabel_configs: must be a list"):
        load_relabel_configs("relabel_configs: {a: 1}\n")
    assert load_relabel_configs("") == ()
    assert load_relabel_configs("node: n1\n") == ()  # a parca config without rules


def test_regex_anchoring_and_dotall() -> None:
    rx = AnchoredRegex("a.c")
    assert rx.matches("a\nc")
    assert not rx.matches("xa.c") and not rx.matches("a.cx")
    assert AnchoredRegex("a|b").matches("b") and not AnchoredRegex("a|b").matches("ab")
    assert AnchoredRegex("(?i)abc").matches("ABC")
    assert AnchoredRegex(r"\pL+").matches("héllo")


def test_expand_go_semantics() -> None:
    rx = AnchoredRegex("(?P<x>a)(b)?(c)")
    text = "ac"
    spans = rx.spans(text)
    assert spans is not None
    assert expand("$1|${2}|$3|$x|${x}|$9|$$|$", text, rx, spans) == "a||c|a|a||$|$"
    assert expand("${x", text, rx, spans) == "${x"
    assert expand("$01", text, rx, spans) == ""  # leading zero: a name, not group 1
    assert expand("no dollars", text, rx, spans) == "no dollars"


def test_label_builder_semantics() -> None:
    lb = LabelBuilder({"b": "1", "a": "2", "e": ""})
    assert lb.get("e") == ""  # empty values are missing labels
    lb.set("c", "3")
    lb.delete("a")
    lb.set("b", "")  # setting empty deletes
    lb.set("a", "4")  # re-added after deletion
    assert lb.get("a") == "4" and lb.get("b") == ""
    assert lb.snapshot() == [("c", "3"), ("a", "4")]
    assert lb.labels() == {"c": "3", "a": "4"}


def test_strip_meta_keeps_other_double_underscore_labels() -> None:
    labels = {"__meta_x": "1", "__tmp": "2", "a": "3"}
    assert strip_meta(labels) == {"__tmp": "2", "a": "3"}


PARCA_K8S = TESTDATA / "identity" / "parca_kubernetes_config.yaml"


def test_parca_kubernetes_config_loads_unchanged() -> None:
    rules = load_relabel_configs(PARCA_K8S.read_text())
    assert len(rules) == 11
    assert [r.action for r in rules][-2:] == [Action.LABELMAP, Action.LABELDROP]


def test_parca_kubernetes_config_on_a_declared_pod() -> None:
    """The shipped parca-agent Kubernetes config applied to what the profiler declared."""
    rules = load_relabel_configs(PARCA_K8S.read_text())
    info = ProcfsReader(str(PROC / "host"), host_pid_namespace=True, user_name=lambda u: None).read(
        4242
    )
    profiler: dict[str, AttrValue] = {
        "k8s.namespace.name": "ml",
        "k8s.pod.name": "trainer-0",
        "k8s.pod.uid": "0b1c-2d3e",
        "k8s.container.name": "main",
        "container.image.name": "registry.example/trainer:1.4",
        "k8s.pod.label.app": "trainer",
        "k8s.pod.label.app.kubernetes.io/name": "trainer",
        "k8s.pod.label.pod-template-hash": "5d9f7",
        "k8s.pod.label.controller-revision-hash": "abc",
        "k8s.node.label.topology.kubernetes.io/region": "eu-west-1",
        "k8s.node.label.topology.kubernetes.io/zone": "eu-west-1a",
        "gpu.count": 8,  # not a string: never a label
    }
    labels = process_labels(
        4242,
        info,
        {},
        profiler,
        {},
        node_name="node-a",
        in_kubernetes=True,
        system_labels={
            "__meta_system_kernel_release": "6.8.0",
            "__meta_system_kernel_machine": "x86_64",
        },
    )
    assert labels["__meta_kubernetes_pod_label_app_kubernetes_io_name"] == "trainer"
    assert labels["__meta_kubernetes_pod_labelpresent_app"] == "true"
    out = relabel(labels, rules)
    assert out is not None
    kept = strip_meta(out)
    assert kept == {
        "node": "node-a",
        "comm": "python3",
        "arch": "x86_64",
        "kernel_version": "6.8.0",
        "namespace": "ml",
        "pod": "trainer-0",
        "container": "main",
        "container_image": "registry.example/trainer:1.4",
        "region": "eu-west-1",
        "zone": "eu-west-1a",
        "app": "trainer",
        "app_kubernetes_io_name": "trainer",
        # pod_template_hash and controller_revision_hash were dropped by the labeldrop rule;
        # compiler has no source (we do not analyse executables), so it is absent.
    }
    assert labels_to_attributes(out) == {
        "arch": "x86_64",
        "kernel_version": "6.8.0",
        "k8s.namespace.name": "ml",
        "k8s.pod.name": "trainer-0",
        "k8s.container.name": "main",
        "container_image": "registry.example/trainer:1.4",
        "region": "eu-west-1",
        "zone": "eu-west-1a",
        "app": "trainer",
        "app_kubernetes_io_name": "trainer",
    }


def test_parca_repo_config_exec_label() -> None:
    rules = load_relabel_configs(
        "relabel_configs:\n"
        "- source_labels: [__meta_process_executable_name]\n  target_label: exec\n"
        "  action: replace\n"
        "- source_labels: [__meta_process_executable_compiler]\n  target_label: compiler\n"
        "  action: replace\n"
    )
    info = ProcfsReader(str(PROC / "host"), host_pid_namespace=True).read(4242)
    labels = process_labels(
        4242, info, {}, {}, {}, node_name="", in_kubernetes=False, system_labels={}
    )
    out = relabel(labels, rules)
    assert out is not None and strip_meta(out) == {"comm": "python3", "exec": "python3.11"}
