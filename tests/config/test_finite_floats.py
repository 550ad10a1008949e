"""Every float setting refuses NaN and infinity, naming the setting (issue 23 item 6).

``float()`` and YAML read ``nan``/``.nan`` and ``inf``/``.inf``. NaN compares false with every
bound, so a bounded setting said ``Input should be less than or equal to 3600``, and infinity
passed every setting without an upper bound. The rule lives in one place
(``gpumetrics.settingsbase.SettingsModel``); these tests walk the whole configuration tree, so a
float setting of a new section that does not derive from it fails here.
"""

from __future__ import annotations

import os
import types
import typing
from collections.abc import Iterator

import pytest
from gpumetrics.cli import main
from gpumetrics.config import ConfigError, load_config
from gpumetrics.config.model import SidecarConfig
from pydantic import BaseModel


def _is_float(annotation: object) -> bool:
    if annotation is float:
        return True
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return float in typing.get_args(annotation)
    return False


def _float_settings(model: type[BaseModel], prefix: str = "") -> Iterator[str]:
    for name, info in model.model_fields.items():
        ann = info.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            yield from _float_settings(ann, f"{prefix}{name}.")
        elif _is_float(ann):
            yield f"{prefix}{name}"


FLOAT_SETTINGS = sorted(_float_settings(SidecarConfig))


def test_the_walk_finds_the_float_settings_of_every_section():
    sections = {path.split(".", 1)[0] for path in FLOAT_SETTINGS}
    assert {"server", "store", "collection", "events", "push", "kubernetes", "runtime"} <= sections
    assert "runtime.batch_interval_s" in FLOAT_SETTINGS
    assert "collection.cycle_timeout_s" in FLOAT_SETTINGS  # float | None


def _yaml_tree(path: str, text: str) -> str:
    *parents, leaf = path.split(".")
    lines = [f"{'  ' * i}{part}:" for i, part in enumerate(parents)]
    lines.append(f"{'  ' * len(parents)}{leaf}: {text}")
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("path", FLOAT_SETTINGS)
@pytest.mark.parametrize(("text", "shown"), [(".nan", "nan"), (".inf", "inf"), ("-.inf", "-inf")])
def test_every_float_setting_refuses_nan_and_infinity_from_the_file(tmp_path, path, text, shown):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(_yaml_tree(path, text))
    with pytest.raises(ConfigError) as exc:
        load_config(str(cfg), environ={})
    assert f"'{path}' (from {cfg}): must be a finite number, got {shown}" in str(exc.value)


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "NaN", "Infinity"])
def test_batch_interval_from_the_environment(value):
    with pytest.raises(ConfigError) as exc:
        load_config(None, {"GPUMETRICS_BATCH_INTERVAL_S": value})
    assert str(exc.value) == (  # the value as written
        f"'runtime.batch_interval_s' (from GPUMETRICS_BATCH_INTERVAL_S={value!r}): "
        f"must be a finite number, got {value}"
    )


@pytest.mark.parametrize("value", ["nan", "inf"])
def test_batch_interval_from_the_flag_is_one_line_naming_it(capsys, monkeypatch, value):
    for name in [n for n in os.environ if n.startswith("GPUMETRICS_")]:
        monkeypatch.delenv(name)  # e.g. the test command's GPUMETRICS_SKIP_E2E: a warning line
    code = main(["serve", "--batch-interval", value])
    err = capsys.readouterr().err
    assert code == 2
    assert err == (
        f"gpumetrics: 'runtime.batch_interval_s' (from flag --batch-interval): "
        f"must be a finite number, got {value}\n"
    )


def test_finite_values_still_load():
    cfg = load_config(None, {"GPUMETRICS_BATCH_INTERVAL_S": "2.5"})
    assert cfg.runtime.batch_interval_s == 2.5
