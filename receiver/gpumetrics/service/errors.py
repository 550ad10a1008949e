"""Errors of the service layer that name the :class:`~gpumetrics.service.ServerSettings` field.

The runtime turns them into :class:`gpumetrics.config.ConfigError` lines under ``server.``, so a
token file, a TLS file or a listener that cannot be used is reported like any other setting:
``'server.pull_token_file' (from flag --pull-token-file): cannot read ...`` (exit 2).
"""

from __future__ import annotations

__all__ = ["SettingError"]


class SettingError(ValueError):
    """A setting's value cannot be used (a file, a token, a socket path).

    Attributes:
        setting: the field of :class:`~gpumetrics.service.ServerSettings`, e.g.
            ``pull_token_file`` or ``listen[0]``.
        reason: what is wrong and, where there is one, how to fix it.

    ``str()`` is ``'<setting>': <reason>``.

    """

    def __init__(self, setting: str, reason: str) -> None:
        self.setting = setting
        self.reason = reason
        super().__init__(f"'{setting}': {reason}")
