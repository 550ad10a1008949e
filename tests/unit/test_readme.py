"""README claims that code can check: the quick start's commands, the scenario example, CI."""

import os
import re
from pathlib import Path

import nvmlsim as sim

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()


def search(pattern: str, text: str) -> str:
    """The first group of ``pattern`` in ``text`` (the test fails when it is not there)."""
    m = re.search(pattern, text, re.S)
    assert m is not None, f"{pattern!r} not found"
    return m.group(1)


def quick_start_commands():
    section = README.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    block = search(r"```sh\n(.*?)```", section)
    return [line.split("#", 1)[0].strip() for line in block.splitlines() if line.strip()]


def test_quick_start_is_exactly_two_existing_executable_commands():
    commands = quick_start_commands()
    assert commands == ["./scripts/quickstart.sh", "./scripts/test.sh"]
    for cmd in commands:
        path = ROOT / cmd
        assert path.is_file() and os.access(path, os.X_OK), cmd


def test_ci_runs_the_readme_test_command():
    ci = (ROOT / ".ci" / "run").read_text()
    assert "./scripts/test.sh" in ci


def test_the_scenario_example_in_the_readme_loads():
    section = README.split("## The simulated driver", 1)[1]
    text = search(r"```yaml\n(.*?)```", section)
    scenario = sim.scenario_from_data(__import__("yaml").safe_load(text))
    assert [d.uuid for d in scenario.devices] == ["GPU-11111111-2222-4333-8444-555555555555"]


def test_the_relabel_example_in_identity_md_drops_and_labels_as_described():
    from gpumetrics.identity.relabel import relabel
    from gpumetrics.identity.relabel_config import load_relabel_configs

    text = (ROOT / "docs" / "identity.md").read_text()
    rules = load_relabel_configs(search(r"```yaml\n(relabel_configs:.*?)```", text))
    assert relabel({"__meta_env_var_OTEL_SERVICE_NAME": "batch-etl"}, rules) is None
    kept = relabel(
        {"__meta_env_var_OTEL_SERVICE_NAME": "trainer", "__meta_kubernetes_namespace": "ml"}, rules
    )
    assert kept is not None and "stage" not in kept and kept["region"] == "eu-west-1"
    staged = relabel({"__meta_kubernetes_namespace": "shop-prod"}, rules)
    assert staged is not None and staged["stage"] == "prod"


def test_the_readme_lists_every_built_in_profile():
    """README's ``--simulate`` sentence and nvmlsim's profile table name every shipped profile."""
    listed = search(r"`python -m nvmlsim list`: (.*?)\), a field case", README)
    names = set(re.findall(r"`([a-z0-9-]+)`", listed))
    assert names == set(sim.list_profiles())
    table = (ROOT / "nvmlsim" / "README.md").read_text()
    assert set(re.findall(r"^\| `([a-z0-9-]+)`", table, re.M)) >= set(sim.list_profiles())
