{{/* Names and labels. */}}
{{- define "gpumetrics.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "gpumetrics.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "gpumetrics.selectorLabels" -}}
app.kubernetes.io/name: {{ include "gpumetrics.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "gpumetrics.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "gpumetrics.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{- define "gpumetrics.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "gpumetrics.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* "true" when the sidecar reads this node's ResourceSlices (DRA), else empty. */}}
{{- define "gpumetrics.readsResourceSlices" -}}
{{- if and .Values.podAttribution.enabled .Values.podAttribution.dra.resourceSlices -}}true{{- end -}}
{{- end -}}

{{/* Checks of combinations the schema cannot express. */}}
{{- define "gpumetrics.validate" -}}
{{- if not (has .Values.topology (list "sidecar" "subprocess")) -}}
{{- fail (printf "topology: %q is neither sidecar nor subprocess" .Values.topology) -}}
{{- end -}}
{{- if not (has .Values.sidecar.store.type (list "hostPath" "emptyDir" "none")) -}}
{{- fail (printf "sidecar.store.type: %q is none of hostPath, emptyDir, none" .Values.sidecar.store.type) -}}
{{- end -}}
{{- if not (has .Values.processMetrics.hostAccess (list "hostPID" "hostProc")) -}}
{{- fail (printf "processMetrics.hostAccess: %q is neither hostPID nor hostProc" .Values.processMetrics.hostAccess) -}}
{{- end -}}
{{- if and (include "gpumetrics.otlpEnabled" .) (not (include "gpumetrics.otlpEndpoint" .)) -}}
{{- fail "otlp.enabled: set otlp.endpoint (or gateway.enabled)" -}}
{{- end -}}
{{- if not (or .Values.prometheus.enabled (include "gpumetrics.otlpEnabled" .) .Values.collector.config.exporters) -}}
{{- fail "nothing to export to: enable prometheus or otlp (or gateway), or add exporters in collector.config" -}}
{{- end -}}
{{- end -}}

{{/* The sidecar runs as root when it must connect to the kubelet's root-owned socket or read
     other users' /proc/<pid>/environ; it never keeps a capability it does not need. */}}
{{- define "gpumetrics.sidecarRoot" -}}
{{- if or .Values.podAttribution.enabled (and .Values.processMetrics.enabled .Values.processMetrics.readEnvironment) -}}true{{- end -}}
{{- end -}}

{{- define "gpumetrics.hostPID" -}}
{{- if and .Values.processMetrics.enabled (eq .Values.processMetrics.hostAccess "hostPID") -}}true{{- end -}}
{{- end -}}

{{- define "gpumetrics.hostProc" -}}
{{- if and .Values.processMetrics.enabled (eq .Values.processMetrics.hostAccess "hostProc") -}}true{{- end -}}
{{- end -}}

{{- define "gpumetrics.otlpEnabled" -}}
{{- if or .Values.otlp.enabled .Values.gateway.enabled -}}true{{- end -}}
{{- end -}}

{{- define "gpumetrics.otlpEndpoint" -}}
{{- if .Values.otlp.endpoint -}}
{{- .Values.otlp.endpoint -}}
{{- else if .Values.gateway.enabled -}}
{{- printf "%s-gateway.%s.svc:%d" (include "gpumetrics.fullname" .) .Release.Namespace (int .Values.gateway.port) -}}
{{- end -}}
{{- end -}}

{{/* The durable store (sidecar.store): where the container sees it, and the node's directory. */}}
{{- define "gpumetrics.storeMount" -}}/var/lib/gpumetrics{{- end -}}

{{- define "gpumetrics.storeHostPath" -}}
{{- .Values.sidecar.store.hostPath | default (printf "/var/lib/gpumetrics/%s-%s" .Release.Namespace (include "gpumetrics.fullname" .)) -}}
{{- end -}}

{{- define "gpumetrics.store" -}}
{{- if ne .Values.sidecar.store.type "none" -}}true{{- end -}}
{{- end -}}

{{/* The gpumetrics user and group of both images' conventions (compose uses the same). */}}
{{- define "gpumetrics.uid" -}}10001{{- end -}}

{{/* securityContext of the container that runs the sidecar. */}}
{{- define "gpumetrics.sidecarSecurityContext" -}}
{{- $root := include "gpumetrics.sidecarRoot" . -}}
{{- $caps := list -}}
{{- if and .Values.processMetrics.enabled .Values.processMetrics.readEnvironment -}}
{{- $caps = list "SYS_PTRACE" "DAC_READ_SEARCH" -}}
{{- end -}}
runAsUser: {{ if $root }}0{{ else }}{{ include "gpumetrics.uid" . }}{{ end }}
runAsGroup: {{ include "gpumetrics.uid" . }}
runAsNonRoot: {{ not $root }}
readOnlyRootFilesystem: true
allowPrivilegeEscalation: false
capabilities:
  drop: [ALL]
  {{- with $caps }}
  add: {{ toJson . }}
  {{- end }}
{{- end -}}

{{/* gpumetrics.yaml, the sidecar's configuration (docs/configuration.md). */}}
{{- define "gpumetrics.sidecarConfig" -}}
{{- $server := dict "health_listen" (printf "0.0.0.0:%d" (int .Values.sidecar.healthPort)) -}}
{{/* The profiler service on its own unix socket in a pod volume (not the default, which
     depends on the sidecar's uid and may be on the read-only root filesystem): the run volume
     shared by the two containers, or in subprocess mode the Collector container's private /tmp.
     A caller's SO_PEERCRED decides what it may declare (docs/security.md). */}}
{{- $profilerSocket := ternary "unix:///tmp/profiler.sock" "unix:///run/gpumetrics/profiler.sock" (eq .Values.topology "subprocess") -}}
{{- $_ := set $server "profiler_listen" (list $profilerSocket) -}}
{{- if eq .Values.topology "sidecar" -}}
{{- $_ := set $server "listen" (list "unix:///run/gpumetrics/gpumetrics.sock") -}}
{{- $_ := set $server "unix_socket_mode" "0660" -}}
{{- $_ := set $server "unix_socket_group" (include "gpumetrics.uid" .) -}}
{{- end -}}
{{- $identity := dict "in_kubernetes" true -}}
{{- if include "gpumetrics.hostProc" . -}}
{{- $_ := set $identity "proc_root" "/host/proc" -}}
{{- end -}}
{{- if not (and .Values.processMetrics.enabled .Values.processMetrics.readEnvironment) -}}
{{- $_ := set $identity "read_process_context" false -}}
{{- end -}}
{{- $kubernetes := dict "pod_attribution" .Values.podAttribution.enabled -}}
{{- if .Values.podAttribution.enabled -}}
{{- $_ := set $kubernetes "pod_resources_socket" (printf "%s/kubelet.sock" (trimSuffix "/" .Values.podAttribution.socketDir)) -}}
{{- $_ := set $kubernetes "gpu_id_type" .Values.podAttribution.gpuIdType -}}
{{- $_ := set $kubernetes "dra" (dict "resource_slices" (include "gpumetrics.readsResourceSlices" . | empty | not) "drivers" .Values.podAttribution.dra.drivers) -}}
{{- end -}}
{{- $store := dict "max_bytes" (int64 .Values.sidecar.storeMaxBytes) -}}
{{- if include "gpumetrics.store" . -}}
{{- $_ := set $store "path" (include "gpumetrics.storeMount" .) -}}
{{- end -}}
{{- $config := dict
  "server" $server
  "store" $store
  "collection" (dict "interval_s" .Values.sidecar.collectionIntervalSeconds "process_metrics" .Values.processMetrics.enabled)
  "identity" $identity
  "kubernetes" $kubernetes
  "runtime" (dict "batch_interval_s" .Values.sidecar.batchIntervalSeconds)
  "log" (dict "level" .Values.sidecar.logLevel "format" "json")
-}}
{{- toYaml (mustMergeOverwrite $config (deepCopy .Values.sidecar.config)) -}}
{{- end -}}

{{/* The Collector's configuration (docs/collector.md). Its listeners bind every address of
     the pod: the pod IP for probes and scrapes, loopback for `kubectl port-forward`. */}}
{{- define "gpumetrics.collectorConfig" -}}
{{- $receiver := dict "collection_interval" .Values.collector.scrapeInterval "timeout" .Values.collector.scrapeTimeout -}}
{{- if eq .Values.topology "sidecar" -}}
{{- $_ := set $receiver "endpoint" "unix:///run/gpumetrics/gpumetrics.sock" -}}
{{- else -}}
{{- $_ := set $receiver "command" "gpumetrics" -}}
{{- $_ := set $receiver "args" (list "serve" "--plugin" "--config=/etc/gpumetrics/gpumetrics.yaml") -}}
{{- $_ := set $receiver "start_timeout" "60s" -}}
{{- end -}}
{{- /* Acknowledged means persisted (docs/collector.md): no batch processor; each exporter takes
     what the receiver acknowledges into a sending queue on disk (file_storage), where it is
     batched too. */ -}}
{{- $queue := dict "storage" "file_storage" "num_consumers" 1 "sizer" "requests" "queue_size" (int .Values.collector.queue.queueSize) "batch" (dict "flush_timeout" "200ms" "sizer" "items" "min_size" 8192) -}}
{{- $exporters := dict -}}
{{- $names := list -}}
{{- if .Values.prometheus.enabled -}}
{{- $_ := set $exporters "prometheus" (dict "endpoint" (printf "0.0.0.0:%d" (int .Values.prometheus.port)) "metric_expiration" .Values.prometheus.metricExpiration "resource_constant_labels" (dict "included" (list "*")) "sending_queue" (deepCopy $queue)) -}}
{{- $names = append $names "prometheus" -}}
{{- end -}}
{{- if include "gpumetrics.otlpEnabled" . -}}
{{- $tls := dict -}}
{{- if .Values.otlp.insecure -}}{{- $_ := set $tls "insecure" true -}}
{{- else if and .Values.gateway.enabled (not .Values.otlp.endpoint) -}}{{- $_ := set $tls "insecure" true -}}
{{- else if .Values.otlp.caFile -}}{{- $_ := set $tls "ca_file" .Values.otlp.caFile -}}
{{- end -}}
{{- $otlp := dict "endpoint" (include "gpumetrics.otlpEndpoint" .) "compression" .Values.otlp.compression "sending_queue" (deepCopy $queue) "retry_on_failure" (dict "max_elapsed_time" "0s") -}}
{{- if $tls -}}{{- $_ := set $otlp "tls" $tls -}}{{- end -}}
{{- if .Values.otlp.headers -}}{{- $_ := set $otlp "headers" .Values.otlp.headers -}}{{- end -}}
{{- $_ := set $exporters "otlp_grpc" $otlp -}}
{{- $names = append $names "otlp_grpc" -}}
{{- end -}}
{{- range $name, $_ := .Values.collector.config.exporters -}}
{{- if not (has $name $names) -}}{{- $names = append $names $name -}}{{- end -}}
{{- end -}}
{{- /* The GPU events (docs/events.md): in full in the Collector's log, and pushed with the
     metrics when OTLP is on. */ -}}
{{- $logNames := list -}}
{{- if .Values.events.enabled -}}
{{- if .Values.events.log -}}
{{- $_ := set $exporters "debug/events" (dict "verbosity" "detailed") -}}
{{- $logNames = append $logNames "debug/events" -}}
{{- end -}}
{{- if include "gpumetrics.otlpEnabled" . -}}{{- $logNames = append $logNames "otlp_grpc" -}}{{- end -}}
{{- end -}}
{{- $pipelines := dict "metrics" (dict "receivers" (list "gpumetrics") "processors" (list "memory_limiter") "exporters" $names) -}}
{{- if $logNames -}}
{{- $_ := set $pipelines "logs" (dict "receivers" (list "gpumetrics") "processors" (list "memory_limiter") "exporters" $logNames) -}}
{{- end -}}
{{- $config := dict
  "receivers" (dict "gpumetrics" $receiver)
  "processors" (dict
    "memory_limiter" (dict "check_interval" "1s" "limit_mib" (int .Values.collector.memoryLimitMiB) "spike_limit_mib" (int .Values.collector.memorySpikeLimitMiB)))
  "exporters" $exporters
  "extensions" (dict
    "health_check" (dict "endpoint" (printf "0.0.0.0:%d" (int .Values.collector.healthPort)))
    "file_storage" (dict "directory" "/var/lib/otelcol-gpumetrics" "create_directory" true "fsync" true))
  "service" (dict
    "extensions" (list "health_check" "file_storage")
    "telemetry" (dict "metrics" (dict "readers" (list (dict "pull" (dict "exporter" (dict "prometheus" (dict "host" "0.0.0.0" "port" (int .Values.collector.telemetryPort))))))))
    "pipelines" $pipelines)
-}}
{{- toYaml (mustMergeOverwrite $config (deepCopy .Values.collector.config)) -}}
{{- end -}}

{{/* Environment of the container that runs the sidecar. */}}
{{- define "gpumetrics.sidecarEnv" -}}
- name: GPUMETRICS_NODE_NAME
  valueFrom: {fieldRef: {fieldPath: spec.nodeName}}
- name: NVIDIA_VISIBLE_DEVICES
  value: {{ .Values.nvidiaVisibleDevices | quote }}
- name: NVIDIA_DRIVER_CAPABILITIES
  value: utility
{{- with .Values.simulate }}
- name: GPUMETRICS_SIMULATE
  value: {{ . | quote }}
{{- end }}
{{- with .Values.sidecar.extraEnv }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* Mounts of the container that runs the sidecar. */}}
{{- define "gpumetrics.sidecarMounts" -}}
- {name: sidecar-config, mountPath: /etc/gpumetrics, readOnly: true}
{{- if include "gpumetrics.store" . }}
- {name: store, mountPath: {{ include "gpumetrics.storeMount" . }}}
{{- end }}
{{- if .Values.podAttribution.enabled }}
- {name: pod-resources, mountPath: {{ .Values.podAttribution.socketDir }}, readOnly: true}
{{- end }}
{{- if include "gpumetrics.readsResourceSlices" . }}
# the service account token, for the one API call the sidecar makes (list resourceslices)
- {name: kube-api-access, mountPath: /var/run/secrets/kubernetes.io/serviceaccount, readOnly: true}
{{- end }}
{{- if include "gpumetrics.hostProc" . }}
- {name: host-proc, mountPath: /host/proc, readOnly: true}
{{- end }}
{{- with .Values.extraVolumeMounts }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* gRPC probes on the sidecar's plaintext health listener: SERVING once the first collection
     is stored, NOT_SERVING from the start of a shutdown. NVML init may retry for a while. */}}
{{- define "gpumetrics.sidecarProbes" -}}
readinessProbe:
  grpc: {port: {{ .Values.sidecar.healthPort }}}
  periodSeconds: 10
livenessProbe:
  grpc: {port: {{ .Values.sidecar.healthPort }}}
  periodSeconds: 30
  failureThreshold: 10
{{- end -}}
