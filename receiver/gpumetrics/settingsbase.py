"""``SettingsModel``: the base of every settings model, so every setting obeys the same rules.

Every section of the sidecar's configuration (``server``, ``store``, ``collection``, ``events``,
``identity``, ``push``, ``kubernetes``, ``runtime``, ``plugin``, ``log``) is a pydantic model
derived from :class:`SettingsModel`, which

* forbids unknown keys (a misspelt setting is an error, not a silent default);
* is frozen (settings never change after validation);
* refuses NaN and ±infinity in every float setting (pydantic's ``allow_inf_nan=False``, error
  type ``finite_number``). Without it ``nan`` fails a bound with a misleading text (``Input
  should be less than or equal to 3600``: every comparison with NaN is false) and ``inf``
  passes every setting that has no upper bound (``keepalive_time_s``, the store's
  ``max_age_s``, push ``timeout_s``), to overflow later. ``gpumetrics.config.load`` words the
  error ``must be a finite number, got nan``, naming the setting and where the value came from.

A new settings model inherits these by deriving from :class:`SettingsModel`; a test walks the
whole configuration tree and fails on a float setting that accepts NaN or infinity.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

__all__ = ["SETTINGS_CONFIG", "SettingsModel"]

SETTINGS_CONFIG = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)
"""The pydantic configuration every settings model shares (see the module docstring)."""


class SettingsModel(BaseModel):
    """Base of every settings model: unknown keys forbidden, frozen, floats finite."""

    model_config = SETTINGS_CONFIG
