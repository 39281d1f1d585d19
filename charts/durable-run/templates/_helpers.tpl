{{/* The chart name, or nameOverride. */}}
{{- define "durable-run.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/*
The prefix of every resource name: fullnameOverride, else the release name
when it already contains the chart name, else <release>-<chart>.
*/}}
{{- define "durable-run.fullname" -}}
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

{{- define "durable-run.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Labels on every object of the release. */}}
{{- define "durable-run.labels" -}}
helm.sh/chart: {{ include "durable-run.chart" . }}
app.kubernetes.io/name: {{ include "durable-run.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: durable-run
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* Selects the operator's pods (never changes across upgrades: selectors are immutable). */}}
{{- define "durable-run.selectorLabels" -}}
app.kubernetes.io/name: {{ include "durable-run.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end -}}

{{- define "durable-run.operatorLabels" -}}
{{ include "durable-run.labels" . }}
app.kubernetes.io/component: operator
{{- end -}}

{{/* The operator's ServiceAccount. */}}
{{- define "durable-run.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "durable-run.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.name must name an existing ServiceAccount when serviceAccount.create is false" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* repository@digest, else repository:tag (tag defaults to appVersion). Call with (dict "image" ... "context" $). */}}
{{- define "durable-run.image" -}}
{{- if .image.digest -}}
{{- printf "%s@%s" .image.repository .image.digest -}}
{{- else -}}
{{- printf "%s:%s" .image.repository (default .context.Chart.AppVersion .image.tag) -}}
{{- end -}}
{{- end -}}

{{/*
The operator's permissions: what it needs to run DurableRuns, nothing more.
Used by the ClusterRole (all namespaces) or by one Role per watched namespace.
*/}}
{{- define "durable-run.operatorRules" -}}
# The runs themselves: watch them, keep kopf's progress annotations and the
# run finalizer, delete a run whose ttlSecondsAfterFinished has passed, create
# the child runs a runner asks for in its status (runners cannot), and deliver
# child outcomes, signals, suspension and aborts to runs (spec and annotations).
- apiGroups: ["durablerun.dev"]
  resources: ["durableruns"]
  verbs: ["get", "list", "watch", "create", "patch", "update", "delete"]
- apiGroups: ["durablerun.dev"]
  resources: ["durableruns/status"]
  verbs: ["get", "patch", "update"]
# Owner references with blockOwnerDeletion on the objects a run owns.
- apiGroups: ["durablerun.dev"]
  resources: ["durableruns/finalizers"]
  verbs: ["update"]
# DurableRunSchedules: watched and read; their status written; their runs
# (above) owned by them, with blockOwnerDeletion.
- apiGroups: ["durablerun.dev"]
  resources: ["durablerunschedules"]
  verbs: ["get", "list", "watch"]
- apiGroups: ["durablerun.dev"]
  resources: ["durablerunschedules/status"]
  verbs: ["get", "patch"]
- apiGroups: ["durablerun.dev"]
  resources: ["durablerunschedules/finalizers"]
  verbs: ["update"]
# One runner pod per attempt; the operator's finalizer on each pod is removed
# with a patch once the pod's termination cause has been read.
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["get", "list", "watch", "create", "delete", "patch"]
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create", "patch"]
- apiGroups: ["events.k8s.io"]
  resources: ["events"]
  verbs: ["create", "patch"]
# The per-run ServiceAccount, Role and RoleBinding `durablerun-<run>` that let
# a runner read its own run and patch its own status. Creating that Role needs
# the operator to hold the verbs it grants (get/watch durableruns, get/patch
# durableruns/status): RBAC refuses to let anyone grant more than they hold.
- apiGroups: [""]
  resources: ["serviceaccounts"]
  verbs: ["get", "create", "delete"]
- apiGroups: ["rbac.authorization.k8s.io"]
  resources: ["roles", "rolebindings"]
  verbs: ["get", "create", "patch", "delete"]
{{- if .Values.kueue.enabled }}
# Kueue: one Workload per queued attempt, deleted when the attempt ends (its
# quota released); watched for admission and eviction.
- apiGroups: ["kueue.x-k8s.io"]
  resources: ["workloads"]
  verbs: ["get", "list", "watch", "create", "delete"]
{{- end }}
{{- end -}}
