"""Validated sidecar configuration: the model, ``GPUMETRICS_*`` variables and loading.

Precedence: command-line flags > ``GPUMETRICS_*`` environment variables > YAML file > defaults
(:func:`default_config`). See ``docs/configuration.md`` for every setting.
"""

from gpumetrics.config.env import ENV_BINDINGS, EnvBinding, EnvKind, unknown_variables
from gpumetrics.config.load import (
    ConfigError,
    ConfigSources,
    config_sources,
    format_validation_error,
    load_config,
    read_config_file,
)
from gpumetrics.config.model import (
    DeclaredLimits,
    IdentitySettings,
    LogSettings,
    PluginSettings,
    PluginTransport,
    RuntimeSettings,
    SidecarConfig,
    StoreSettings,
    default_config,
)

__all__ = [
    "ENV_BINDINGS",
    "ConfigError",
    "ConfigSources",
    "DeclaredLimits",
    "EnvBinding",
    "EnvKind",
    "IdentitySettings",
    "LogSettings",
    "PluginSettings",
    "PluginTransport",
    "RuntimeSettings",
    "SidecarConfig",
    "StoreSettings",
    "config_sources",
    "default_config",
    "format_validation_error",
    "load_config",
    "read_config_file",
    "unknown_variables",
]
