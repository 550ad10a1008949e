"""Metric, attribute and scope name constants (the seed's names, kept recognisable).

Metric names mirror ``catalogue.yaml``; ``tests/unit/test_catalogue.py`` fails if the two drift.
Attribute keys are the semantic conventions' (v1.44.0, ``model/hardware``, ``model/network``,
``model/process``, ``model/k8s``) where one exists, ``nvidia.*`` otherwise.
"""

ScopeName = "parca.nvidia_gpu_metrics"
"""Instrumentation scope of the GPU metrics (the seed's ``ScopeName``)."""

SelfScopeName = "gpumetrics.self"
"""Instrumentation scope of the sidecar's own telemetry."""

SchemaURL = "https://opentelemetry.io/schemas/1.44.0"
"""Semantic-conventions schema the ``hw.*`` metrics follow."""

# --- metrics (catalogue.yaml) ---
MetricGPUUtilization = "hw.gpu.utilization"
MetricGPUMemoryUsage = "hw.gpu.memory.usage"
MetricGPUMemoryLimit = "hw.gpu.memory.limit"
MetricGPUMemoryUtilization = "hw.gpu.memory.utilization"
MetricGPUMemoryReserved = "nvidia.gpu.memory.reserved"
MetricPower = "hw.power"
MetricEnergy = "hw.energy"
MetricTemperature = "hw.temperature"
MetricStatus = "hw.status"
MetricErrors = "hw.errors"
MetricGPUMemoryCopyUtilization = "nvidia.gpu.memory_copy.utilization"
MetricGPUPowerLimit = "nvidia.gpu.power.limit"
MetricGPUClockSpeed = "nvidia.gpu.clock.speed"
MetricGPUClockEventReason = "nvidia.gpu.clock.event_reason"
MetricGPUPCIeThroughput = "nvidia.gpu.pcie.throughput"
MetricGPUK8sAllocation = "nvidia.gpu.k8s.allocation"
MetricProcessUtilization = "nvidia.gpu.process.utilization"
MetricProcessMemoryCopyUtilization = "nvidia.gpu.process.memory_copy.utilization"
MetricProcessMemoryUsage = "nvidia.gpu.process.memory.usage"
MetricGPUEvents = "nvidia.gpu.events"

# --- attribute keys ---
AttrHwID = "hw.id"
AttrHwName = "hw.name"
AttrHwParent = "hw.parent"
AttrHwVendor = "hw.vendor"
AttrHwModel = "hw.model"
AttrHwSerialNumber = "hw.serial_number"
AttrHwDriverVersion = "hw.driver_version"
AttrHwFirmwareVersion = "hw.firmware_version"
AttrHwType = "hw.type"
AttrHwState = "hw.state"
AttrHwGPUTask = "hw.gpu.task"
AttrErrorType = "error.type"
AttrNetworkIODirection = "network.io.direction"
AttrClockDomain = "nvidia.gpu.clock.domain"
AttrClockEventReason = "nvidia.gpu.clock.event_reason"
AttrMIGMode = "nvidia.gpu.mig.mode"
AttrMIGGPUInstanceID = "nvidia.gpu.mig.gpu_instance.id"
AttrMIGComputeInstanceID = "nvidia.gpu.mig.compute_instance.id"
AttrProcessPID = "process.pid"
AttrK8sNamespaceName = "k8s.namespace.name"
AttrK8sPodName = "k8s.pod.name"
AttrK8sContainerName = "k8s.container.name"
AttrK8sShared = "nvidia.gpu.k8s.shared"
"""True on device points of a GPU the kubelet allocated to more than one container."""
AttrK8sResourceName = "nvidia.gpu.k8s.resource_name"
"""The extended resource a GPU was allocated as (``nvidia.com/gpu``, ``nvidia.com/mig-1g.10gb``)."""
AttrEventType = "nvidia.gpu.event.type"
AttrXidCode = "nvidia.gpu.xid.code"

# --- attribute values ---
HwTypeGPU = "gpu"
GPUTaskGeneral = "general"
GPUTaskEncoder = "encoder"
GPUTaskDecoder = "decoder"
DirectionTransmit = "transmit"
DirectionReceive = "receive"
HwStates = ("ok", "degraded", "failed", "predicted_failure")
"""Every ``hw.state`` value; ``hw.status`` emits each one every cycle (1 for the current)."""
