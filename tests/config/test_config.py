"""Configuration: the sample file, precedence, and errors that name the setting and its source."""

from __future__ import annotations

import ast
import dataclasses
import inspect
from pathlib import Path

import pytest
from gpumetrics.config import (
    ENV_BINDINGS,
    ConfigError,
    default_config,
    load_config,
    unknown_variables,
)
from gpumetrics.config import env as env_module
from gpumetrics.config.model import DeclaredLimits, StoreSettings
from gpumetrics.identity import DeclaredStore, ProcessResourcer
from gpumetrics.identity.resource_limits import ResourceLimits
from gpumetrics.store import StoreLimits
from gpumetrics.store.limits import DEFAULT_MAX_COLLECTION_BYTES

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "gpumetrics.yaml"
DOCS = ROOT / "docs" / "configuration.md"


def test_the_sample_file_loads_and_equals_the_defaults():
    assert load_config(str(EXAMPLE), environ={}) == default_config()


def test_defaults_validate_and_agree_with_the_packages_that_own_them():
    cfg = default_config()
    assert cfg.store.limits() == StoreLimits()
    # the producer's budget and the store's directory: not limits the store holds
    budget = {"max_collection_bytes", "path"}
    assert {f.name for f in dataclasses.fields(StoreLimits)} == set(
        StoreSettings.model_fields
    ) - budget
    assert cfg.store.max_collection_bytes == DEFAULT_MAX_COLLECTION_BYTES
    assert cfg.identity.resource_limits.limits() == ResourceLimits()
    resourcer = inspect.signature(ProcessResourcer.__init__).parameters
    assert cfg.identity.resource_limits.cache_max_bytes == resourcer["cache_max_bytes"].default
    params = inspect.signature(DeclaredStore.__init__).parameters
    for name in DeclaredLimits.model_fields:
        assert getattr(cfg.identity.declared, name) == params[name].default
    assert cfg.collection.proc_root == cfg.identity.proc_root == "/proc"
    assert cfg.push.endpoint is None and cfg.runtime.simulate is None


def test_precedence_flags_over_env_over_file_over_defaults(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("runtime: {batch_interval_s: 5}\nstore: {max_age_s: 60}\nlog: {level: debug}\n")
    env = {"GPUMETRICS_BATCH_INTERVAL_S": "7", "GPUMETRICS_STORE_MAX_AGE_S": "120"}
    flags = {"runtime.batch_interval_s": ("--batch-interval", 9.0)}
    cfg = load_config(str(path), env, flags)
    assert cfg.runtime.batch_interval_s == 9.0  # flag
    assert cfg.store.max_age_s == 120.0  # env over file
    assert cfg.log.level == "debug"  # file over default
    assert cfg.store.max_bytes == StoreSettings().max_bytes  # default


def test_config_file_from_the_environment(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("identity: {node_name: gpu-7}\n")
    assert load_config(None, {"GPUMETRICS_CONFIG": str(path)}).identity.node_name == "gpu-7"


def test_list_and_map_variables():
    env = {
        "GPUMETRICS_LISTEN": "127.0.0.1:0, unix:/tmp/x.sock",
        "GPUMETRICS_PUSH_HEADERS": "x-tenant=ml, authorization=Bearer a=b",
        "GPUMETRICS_DISABLED_METRICS": "hw.errors",
    }
    cfg = load_config(None, env)
    assert cfg.server.listen == ["127.0.0.1:0", "unix:/tmp/x.sock"]
    assert cfg.push.headers == {"x-tenant": "ml", "authorization": "Bearer a=b"}
    assert cfg.collection.disabled_metrics == frozenset({"hw.errors"})


def test_identity_mode_and_variables_from_variables_and_flags():
    from gpumetrics.cli.parser import build_parser, serve_overrides

    cfg = default_config()
    assert cfg.identity.mode == "profiler" and cfg.identity.include_env_vars == ()
    # the eBPF profiler's -env-vars value works unchanged (split on ',', trimmed, blanks dropped)
    env = {"GPUMETRICS_INCLUDE_ENV_VARS": " A , ,B", "GPUMETRICS_IDENTITY_MODE": "enriched"}
    cfg = load_config(None, env)
    assert cfg.identity.mode == "enriched" and cfg.identity.include_env_vars == ("A", "B")
    args = build_parser().parse_args(
        ["serve", "--identity-mode", "profiler", "--include-env-vars", "OTEL_SERVICE_NAME, X"]
    )
    cfg = load_config(None, env, serve_overrides(args))
    assert cfg.identity.mode == "profiler"
    assert cfg.identity.include_env_vars == ("OTEL_SERVICE_NAME", "X")


def test_proc_root_reaches_the_collection_settings():
    cfg = load_config(None, {"GPUMETRICS_PROC_ROOT": "/host/proc"})
    assert cfg.collection.proc_root == "/host/proc"


def errors_of(*args, **kwargs):
    with pytest.raises(ConfigError) as err:
        load_config(*args, **kwargs)
    return err.value.errors


@pytest.mark.parametrize(
    ("yaml_text", "expected"),
    [
        (
            "server: {listen: ['0.0.0.0:4319']}",
            "'server.listen[0]' (from {f}): 0.0.0.0:4319 is not loopback",
        ),
        (
            "server: {tls_cert_file: /c.pem}",
            "'server.tls_key_file' (from {f}): not set, but tls_cert_file is; TLS needs both",
        ),
        ("store: {max_bytes: 0}", "'store.max_bytes' (from {f}): Input should be greater than 0"),
        ("store: {max_byte: 1}", "'store.max_byte' (from {f}): unknown setting"),
        ("colection: {}", "'colection' (from {f}): unknown setting"),
        (
            "collection: {disabled_metrics: [hw.nope]}",
            "'collection.disabled_metrics' (from {f}): unknown metric",
        ),
        (
            "collection: {pcie_interval_s: 0.5}",
            "'collection.pcie_interval_s' (from {f}): must be 0 (off) or >= interval_s",
        ),
        (
            "collection: {proc_root: /x}",
            "'collection.proc_root' (from {f}): set identity.proc_root instead",
        ),
        (
            "identity: {proc_root: proc}",
            "'identity.proc_root' (from {f}): must be an absolute path",
        ),
        (
            "identity: {mode: exact}",
            "'identity.mode' (from {f}): Input should be 'profiler' or 'enriched'",
        ),
        (
            "identity: {include_env_vars: OTEL_SERVICE_NAME}",
            "'identity.include_env_vars' (from {f}): must be a list of environment variable names",
        ),
        (
            "identity: {include_env_vars: [OTEL_SERVICE_NAME, 'A=B']}",
            "'identity.include_env_vars' (from {f}): [1]: 'A=B' cannot contain '=' or NUL",
        ),
        (
            "identity: {declared: {max_processes: 0}}",
            "'identity.declared.max_processes' (from {f}): Input should be greater than or equal",
        ),
        (
            "identity: {resource_limits: {attribute_count_limit: 0}}",
            "'identity.resource_limits.attribute_count_limit' (from {f}): Input should be greater",
        ),
        (
            "identity: {resource_limits: {max_bytes: 8000000}}",
            "'server.pull_default_max_bytes' (from {f}): 4128768 bytes cannot hold one process's "
            "resource: identity.resource_limits.max_bytes lets a resource take 8000000 bytes",
        ),
        (
            "store: {max_collection_bytes: 1000}",
            "'store.max_collection_bytes' (from {f}): 1000 bytes cannot hold one process's "
            "resource (identity.resource_limits.max_bytes lets it take 8192 bytes",
        ),
        (
            "push: {endpoint: 'x:1', cert_file: c.pem}",
            "'push.cert_file' (from {f}): must be set together with key_file",
        ),
        (
            "push: {compression: zstd}",
            "'push.compression' (from {f}): Input should be 'none' or 'gzip'",
        ),
        (
            "runtime: {batch_interval_s: -1}",
            "'runtime.batch_interval_s' (from {f}): Input should be greater than 0",
        ),
        (
            "runtime: {simulate: ''}",
            "'runtime.simulate' (from {f}): must be a profile name or a scenario file",
        ),
        (
            "plugin: {transport: pipe}",
            "'plugin.transport' (from {f}): Input should be 'unix' or 'tcp'",
        ),
        (
            "plugin: {shutdown_timeout_s: 3}",
            "'plugin.shutdown_timeout_s' (from {f}): Input should be less than 2",
        ),
        ("log: {level: loud}", "'log.level' (from {f}): must be one of"),
    ],
)
def test_every_file_error_names_the_setting(tmp_path, yaml_text, expected):
    path = tmp_path / "bad.yaml"
    path.write_text(yaml_text + "\n")
    errors = errors_of(str(path), {})
    assert any(e.startswith(expected.format(f=path)) for e in errors), errors


def test_bad_variables_name_the_variable_value_and_setting():
    errors = errors_of(
        None, {"GPUMETRICS_STORE_MAX_BYTES": "lots", "GPUMETRICS_IN_KUBERNETES": "maybe"}
    )
    assert any(
        e.startswith(
            "'store.max_bytes' (from GPUMETRICS_STORE_MAX_BYTES='lots'): Input should be a valid"
        )
        for e in errors
    )
    assert any(
        e.startswith("'identity.in_kubernetes' (from GPUMETRICS_IN_KUBERNETES='maybe')")
        for e in errors
    )
    assert errors_of(None, {"GPUMETRICS_PUSH_HEADERS": "novalue"}) == [
        "GPUMETRICS_PUSH_HEADERS='novalue': item 'novalue' is not key=value"
    ]


@pytest.mark.parametrize(
    ("text", "expected"),
    [("a: [1\n", "line 2"), ("- a\n- b\n", "the top level must be a mapping")],
)
def test_unparsable_files(tmp_path, text, expected):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    (error,) = errors_of(str(path), {})
    assert error.startswith(f"config file {path}") and expected in error


def test_missing_file(tmp_path):
    (error,) = errors_of(str(tmp_path / "nope.yaml"), {})
    assert "nope.yaml" in error and "No such file" in error


def test_unknown_gpumetrics_variables_are_reported_but_the_cookie_is_not():
    env = {
        "GPUMETRICS_LISTN": "x",
        "GPUMETRICS_LISTEN": "127.0.0.1:0",
        "GPUMETRICS_PLUGIN_MAGIC_COOKIE": "c",
    }
    assert unknown_variables(env, ignore=("GPUMETRICS_PLUGIN_MAGIC_COOKIE",)) == [
        "GPUMETRICS_LISTN"
    ]


def _constants_with_docstrings():
    tree = ast.parse(Path(env_module.__file__).read_text())
    body = tree.body
    found = {}
    for node, nxt in zip(body, body[1:], strict=False):
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
            name = node.targets[0].id
            if name.startswith("GPUMETRICS_"):
                doc = (
                    nxt.value.value
                    if isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant)
                    else None
                )
                found[name] = doc
    return found


def test_every_variable_is_a_documented_constant_bound_to_a_real_setting():
    constants = _constants_with_docstrings()
    for name, doc in constants.items():
        assert getattr(env_module, name) == name
        assert doc and "Default:" in doc and "Example:" in doc, name
    assert {b.name for b in ENV_BINDINGS} | {"GPUMETRICS_CONFIG"} == set(constants)
    cfg = default_config()
    for binding in ENV_BINDINGS:
        node = cfg
        for part in binding.path.split("."):
            node = getattr(node, part)  # AttributeError if the path names no setting


def test_docs_list_every_variable_and_section():
    text = DOCS.read_text()
    for name in _constants_with_docstrings():
        assert f"`{name}`" in text, name
    for section, model in default_config():
        for field in type(model).model_fields:
            assert f"`{section}.{field}`" in text, f"{section}.{field}"
