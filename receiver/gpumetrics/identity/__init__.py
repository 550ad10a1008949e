"""Process identity: per-process OTLP resources that match the process's profiles.

Modules: :mod:`.attrs` (AnyValue ↔ Python), :mod:`.envparse` (strict ``OTEL_*`` parsing),
:mod:`.cgroup` and :mod:`.procfs` (``/proc/<pid>``), :mod:`.ctxproto` and :mod:`.processctx`
(OTEP 4719 process context), :mod:`.declaration` and :mod:`.declared` (what profilers declared),
:mod:`.relabel_config`, :mod:`.relabel` and :mod:`.labels` (parca-agent relabeling),
:mod:`.modes` (the ``profiler`` and ``enriched`` identity modes, the eBPF profiler's own
resource, the observed keys) and :mod:`.resourcer` (the one code path that builds a process's
resource). See ``docs/identity.md``.
"""

from gpumetrics.identity.attrs import AttrValue
from gpumetrics.identity.ctxproto import (
    ProcessContextDecodeError,
    decode_process_context,
    encode_process_context,
)
from gpumetrics.identity.declaration import DeclarationError, DeclarationInput, Declared
from gpumetrics.identity.declared import DeclaredStore, DeclaredStoreStats
from gpumetrics.identity.envparse import (
    EnvResource,
    ResourceAttributesError,
    env_resource,
    parse_resource_attributes,
)
from gpumetrics.identity.modes import (
    IdentityMode,
    check_profiler_mode_rules,
    is_observed_key,
    process_observer,
    profiler_resource,
)
from gpumetrics.identity.processctx import (
    ContextRead,
    ProcessContext,
    ProcessContextReader,
    ReadStatus,
)
from gpumetrics.identity.procfs import ProcessInfo, ProcfsReader
from gpumetrics.identity.relabel import relabel, strip_meta
from gpumetrics.identity.relabel_config import (
    RelabelConfig,
    RelabelConfigError,
    load_relabel_configs,
    parse_relabel_configs,
)
from gpumetrics.identity.resourcer import LabelResolver, ProcessResourcer, new_process_resourcer

__all__ = [
    "AttrValue",
    "ContextRead",
    "DeclarationError",
    "DeclarationInput",
    "Declared",
    "DeclaredStore",
    "DeclaredStoreStats",
    "EnvResource",
    "IdentityMode",
    "LabelResolver",
    "ProcessContext",
    "ProcessContextDecodeError",
    "ProcessContextReader",
    "ProcessInfo",
    "ProcessResourcer",
    "ProcfsReader",
    "ReadStatus",
    "RelabelConfig",
    "RelabelConfigError",
    "ResourceAttributesError",
    "check_profiler_mode_rules",
    "decode_process_context",
    "encode_process_context",
    "env_resource",
    "is_observed_key",
    "process_observer",
    "load_relabel_configs",
    "new_process_resourcer",
    "parse_relabel_configs",
    "parse_resource_attributes",
    "profiler_resource",
    "relabel",
    "strip_meta",
]
