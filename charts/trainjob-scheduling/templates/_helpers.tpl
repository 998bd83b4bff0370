{{/* The base name: <release>-<chart>, or <release> when it already holds the chart's name. */}}
{{- define "tjs.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 44 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 44 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 44 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* <base>-webhook: the Deployment, Service, Lease and both webhook configurations. At most 52
characters, so <name>-metrics-reader and the like stay within 63. */}}
{{- define "tjs.name" -}}
{{- printf "%s-webhook" (include "tjs.fullname" .) -}}
{{- end -}}

{{- define "tjs.secretName" -}}
{{- printf "%s-cert" (include "tjs.name" .) -}}
{{- end -}}

{{- define "tjs.serviceAccountName" -}}
{{- default (include "tjs.name" .) .Values.serviceAccount.name -}}
{{- end -}}

{{/* The username the API server gives the service's requests: the only writer of snapshots. */}}
{{- define "tjs.serviceAccountUsername" -}}
{{- printf "system:serviceaccount:%s:%s" .Release.Namespace (include "tjs.serviceAccountName" .) -}}
{{- end -}}

{{/* CEL: true (call the TrainJob webhook) unless the request is an UPDATE whose only change
is spec.suspend. Metadata other than labels and annotations (resourceVersion, managedFields,
finalizers) is not compared: the webhook judges none of it. */}}
{{/* The keys of a TrainJob's spec whose change alone skips the TrainJob webhook: spec.suspend
for anyone, and spec.runtimePatches too when Kueue's own identity writes it (webhooks.
validateTrainJob.kueueUsername: admission writes its `kueue.x-k8s.io/manager` patch, then
resumes; preemption restores and suspends). A tenant's runtimePatches change is always sent. */}}
{{- define "tjs.skippableSpecKey" -}}
{{- $kueue := .Values.webhooks.validateTrainJob.kueueUsername -}}
{{- if $kueue -}}
(k == 'suspend' || (k == 'runtimePatches' && request.userInfo.username == {{ $kueue | squote }}))
{{- else -}}
(k == 'suspend')
{{- end -}}
{{- end -}}

{{- define "tjs.notOnlySuspend" -}}
{{- $skip := include "tjs.skippableSpecKey" . -}}
request.operation != 'UPDATE' || !has(object.spec) || !has(oldObject.spec) || (has(object.metadata.annotations) ? object.metadata.annotations : {}) != (has(oldObject.metadata.annotations) ? oldObject.metadata.annotations : {}) || (has(object.metadata.labels) ? object.metadata.labels : {}) != (has(oldObject.metadata.labels) ? oldObject.metadata.labels : {}) || object.spec.exists(k, !{{ $skip }} && (!(k in oldObject.spec) || object.spec[k] != oldObject.spec[k])) || oldObject.spec.exists(k, !{{ $skip }} && !(k in object.spec))
{{- end -}}

{{/* CEL: the request sets, changes or removes the TrainJob's runtime snapshot annotation
(webhook/admission/snapshot_guard.py's `snapshot_change`). On CREATE oldObject is null: the
`request.operation == 'UPDATE'` side is false before it is read. */}}
{{- define "tjs.writesSnapshot" -}}
{{- $k := "trainjob-scheduling.dev/runtime-snapshot" -}}
(has(object.metadata.annotations) && '{{ $k }}' in object.metadata.annotations ? object.metadata.annotations['{{ $k }}'] : '<none>') != (request.operation == 'UPDATE' && has(oldObject.metadata.annotations) && '{{ $k }}' in oldObject.metadata.annotations ? oldObject.metadata.annotations['{{ $k }}'] : '<none>')
{{- end -}}

{{- define "tjs.chartLabel" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "tjs.selectorLabels" -}}
app.kubernetes.io/name: {{ default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: webhook
{{- end -}}

{{/* Labels of every object; `component` overrides webhook (e.g. test, cleanup). */}}
{{- define "tjs.labels" -}}
helm.sh/chart: {{ include "tjs.chartLabel" . }}
app.kubernetes.io/name: {{ default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: trainjob-scheduling
{{- end -}}

{{- define "tjs.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}
{{- end -}}

{{/* The namespaces the namespaced webhooks are called for: only the watched ones (when
serve.watchNamespaces lists them), only labelled ones (webhooks.namespaceLabel), and never the
excluded ones or the release's own. The selectors AND together. */}}
{{- define "tjs.namespaceSelector" -}}
{{- with .Values.webhooks.namespaceLabel }}
matchLabels:
  {{ .key | toJson }}: {{ .value | toJson }}
{{- end }}
matchExpressions:
{{- with .Values.serve.watchNamespaces }}
- key: kubernetes.io/metadata.name
  operator: In
  values: {{ uniq . | toJson }}
{{- end }}
- key: kubernetes.io/metadata.name
  operator: NotIn
  values: {{ uniq (append .Values.webhooks.excludeNamespaces .Release.Namespace) | toJson }}
{{- with .Values.webhooks.namespaceSelectorExpressions }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* The namespaces the TrainJob webhook is called for: every namespace the reconciler serves
(all, or serve.watchNamespaces), whatever narrows the other webhooks. It is the runtime
snapshot's tamper check: a TrainJob in a namespace it skipped (unlabelled in label mode,
excluded, the release's own) could carry a tenant's snapshot, and the reconciler would build
that gang. It judges TrainJobs only, so calling it everywhere blocks nothing the cluster needs
to start. */}}
{{- define "tjs.trainjobNamespaceSelector" -}}
{{- with .Values.serve.watchNamespaces }}
matchExpressions:
- key: kubernetes.io/metadata.name
  operator: In
  values: {{ uniq . | toJson }}
{{- else }}
{}
{{- end }}
{{- end -}}

{{/* The CA the Service's certificate chains to lives in this Secret (key ca.crt) in both modes. */}}
{{- define "tjs.caSecretName" -}}
{{- include "tjs.secretName" . -}}
{{- end -}}

{{- define "tjs.checks" -}}
{{- $s := .Values.serve -}}
{{- if le (int .Values.terminationGracePeriodSeconds) (add (int $s.shutdownDelaySeconds) (int $s.shutdownTimeoutSeconds)) -}}
{{- fail (printf "terminationGracePeriodSeconds (%v) must exceed serve.shutdownDelaySeconds + serve.shutdownTimeoutSeconds (%v + %v): the kubelet would kill the pod while reviews are still being answered" .Values.terminationGracePeriodSeconds $s.shutdownDelaySeconds $s.shutdownTimeoutSeconds) -}}
{{- end -}}
{{- if and (gt (int .Values.replicaCount) 1) (not $s.leaderElect) $s.reconcile -}}
{{- fail "serve.leaderElect=false with more than one replica would have every replica reconcile; keep it true, or set replicaCount: 1" -}}
{{- end -}}
{{- end -}}

{{/* The flags of `serve` (webhook/cli.py _SERVE_OPTIONS); extraArgs follow, so they win. */}}
{{- define "tjs.args" -}}
{{- $s := .Values.serve -}}
- --namespace={{ .Release.Namespace }}
- --service-account={{ include "tjs.serviceAccountUsername" . }}
- --port={{ .Values.ports.webhook }}
- --metrics-port={{ .Values.ports.metrics }}
- --health-port={{ .Values.ports.health }}
- --log-level={{ $s.logLevel }}
- --metrics-auth={{ $s.metricsAuth }}
- --reconcile={{ $s.reconcile }}
- --workers={{ $s.workers }}
- --qps={{ $s.qps }}
- --burst={{ $s.burst }}
- --gang-qps={{ $s.gangQps }}
- --gang-burst={{ $s.gangBurst }}
- --leader-elect={{ $s.leaderElect }}
- --lease-name={{ include "tjs.name" . }}
- --lease-duration={{ $s.leaseDurationSeconds }}
- --renew-deadline={{ $s.renewDeadlineSeconds }}
- --retry-period={{ $s.retryPeriodSeconds }}
- --resync-period={{ $s.resyncPeriodSeconds }}
- --shutdown-delay={{ $s.shutdownDelaySeconds }}
- --shutdown-timeout={{ $s.shutdownTimeoutSeconds }}
- --connection-max-requests={{ $s.connectionMaxRequests }}
- --connection-max-age={{ $s.connectionMaxAgeSeconds }}
- --tls-min-version={{ $s.tlsMinVersion }}
{{- with $s.tlsCipherSuites }}
- --tls-cipher-suites={{ join "," . }}
{{- end }}
{{- with $s.watchNamespaces }}
- --watch-namespaces={{ join "," . }}
{{- end }}
- --backends={{ join "," $s.backends }}
- --native-schedulers={{ join "," $s.native.schedulers }}
- --coscheduling-schedulers={{ join "," $s.coscheduling.schedulers }}
- --coscheduling-schedule-timeout={{ $s.coscheduling.scheduleTimeoutSeconds }}
- --coscheduling-affinity-schedulers={{ join "," $s.coscheduling.affinitySchedulers }}
- --volcano-schedulers={{ join "," $s.volcano.schedulers }}
- --volcano-topology-tiers={{ range $i, $key := keys $s.volcano.topologyTiers | sortAlpha }}{{ if $i }},{{ end }}{{ $key }}={{ index $s.volcano.topologyTiers $key }}{{ end }}
- --kai-schedulers={{ join "," $s.kai.schedulers }}
- --kai-default-queue={{ $s.kai.defaultQueue }}
- --kai-topology={{ $s.kai.topology }}
- --feasibility={{ $s.feasibility }}
{{- if eq .Values.certManagement "self" }}
- --cert-management=self
- --cert-secret-name={{ include "tjs.secretName" . }}
- --cert-secret-namespace={{ .Release.Namespace }}
- --webhook-service-name={{ include "tjs.name" . }}
- --mutating-webhook-configuration={{ include "tjs.name" . }}
- --validating-webhook-configuration={{ include "tjs.name" . }}
- --cert-check-period={{ .Values.selfManaged.checkPeriodSeconds }}
{{- else }}
- --cert-management=files
- --cert-dir=/certs
{{- end }}
{{- range .Values.extraArgs }}
- {{ . | quote }}
{{- end }}
{{- end -}}

{{/* The pod settings of the hook and test pods: the service's image, restricted, no token. */}}
{{- define "tjs.utilityPod" -}}
restartPolicy: Never
enableServiceLinks: false
securityContext:
  {{- toYaml .Values.podSecurityContext | nindent 2 }}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{- define "tjs.utilityContainer" -}}
image: {{ include "tjs.image" . }}
imagePullPolicy: {{ .Values.image.pullPolicy }}
resources:
  {{- toYaml .Values.tests.resources | nindent 2 }}
securityContext:
  {{- toYaml .Values.securityContext | nindent 2 }}
{{- end -}}

{{/* The service's rules on namespaced resources: in its ClusterRole, or with
serve.watchNamespaces in a Role of each watched namespace (templates/rbac.yaml). */}}
{{- define "tjs.namespacedRules" -}}
# The webhooks' cache (list + watch); patch: the runtime snapshot annotation; get: whether the
# TrainJob of a JobSet pod the cache has not seen yet exists (hold the pod, or let it through).
- apiGroups: [trainer.kubeflow.org]
  resources: [trainjobs]
  verbs: [get, list, watch, patch]
# get: the snapshot check reads a runtime version its watch has not brought yet.
- apiGroups: [trainer.kubeflow.org]
  resources: [trainingruntimes]
  verbs: [get, list, watch]
# The GangScheduling condition: server-side apply on the status subresource.
- apiGroups: [trainer.kubeflow.org]
  resources: [trainjobs/status]
  verbs: [patch]
# blockOwnerDeletion on the Workloads' and PodGroups' ownerReferences to their TrainJob.
- apiGroups: [trainer.kubeflow.org]
  resources: [trainjobs/finalizers]
  verbs: [update]
# Gang health after admission: JobSet's pods, counted per Job (never kept whole).
- apiGroups: [""]
  resources: [pods]
  verbs: [list, watch]
# A gang's restart attempt: each JobSet's status.restarts (kept trimmed to it and its owner).
- apiGroups: [jobset.x-k8s.io]
  resources: [jobsets]
  verbs: [list, watch]
# Wakes a Job whose pod creations were held once its pods would be tied (one annotation the
# Job controller syncs on), so its backoff never decides when a gang starts.
- apiGroups: [batch]
  resources: [jobs]
  verbs: [patch]
# The reconciler's objects, per gang backend run (and the gang metrics' watch of them). Every
# replica also creates a PodGroup with dryRun=All (nothing stored): whether the API server keeps
# a gang's topology constraint.
{{- if has "native" .Values.serve.backends }}
- apiGroups: [scheduling.k8s.io]
  resources: [workloads, podgroups]
  verbs: [list, watch, create, patch, delete]
# Gangs of gangs (multi-level runtimes); immutable, so made again rather than patched.
- apiGroups: [scheduling.k8s.io]
  resources: [compositepodgroups]
  verbs: [list, watch, create, delete]
{{- end }}
{{- if has "coscheduling" .Values.serve.backends }}
- apiGroups: [scheduling.x-k8s.io]
  resources: [podgroups]
  verbs: [list, watch, create, patch, delete]
{{- end }}
{{- if has "volcano" .Values.serve.backends }}
- apiGroups: [scheduling.volcano.sh]
  resources: [podgroups]
  verbs: [list, watch, create, patch, delete]
{{- end }}
{{- if has "kai" .Values.serve.backends }}
- apiGroups: [scheduling.run.ai]
  resources: [podgroups]
  verbs: [list, watch, create, patch, delete]
{{- end }}
- apiGroups: [events.k8s.io]
  resources: [events]
  verbs: [create]
{{- end -}}
