{{/* Names, labels and shared fragments of the graceful-drain chart. */}}

{{- define "graceful-drain.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Resource name prefix; kept at 48 characters so suffixes like "-webhook-tls" fit in 63. */}}
{{- define "graceful-drain.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 48 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 48 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 48 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "graceful-drain.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "graceful-drain.labels" -}}
helm.sh/chart: {{ include "graceful-drain.chart" . }}
app.kubernetes.io/name: {{ include "graceful-drain.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* Selector labels of one component: include with (list $ "webhook"). */}}
{{- define "graceful-drain.selectorLabels" -}}
{{- $root := index . 0 -}}
app.kubernetes.io/name: {{ include "graceful-drain.name" $root }}
app.kubernetes.io/instance: {{ $root.Release.Name }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end -}}

{{- define "graceful-drain.componentLabels" -}}
{{ include "graceful-drain.labels" (index . 0) }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end -}}

{{- define "graceful-drain.webhook.name" -}}
{{- printf "%s-webhook" (include "graceful-drain.fullname" .) -}}
{{- end -}}

{{- define "graceful-drain.agent.name" -}}
{{- printf "%s-agent" (include "graceful-drain.fullname" .) -}}
{{- end -}}

{{- define "graceful-drain.webhook.serviceAccountName" -}}
{{- if .Values.webhook.serviceAccount.create -}}
{{- default (include "graceful-drain.webhook.name" .) .Values.webhook.serviceAccount.name -}}
{{- else -}}
{{- required "webhook.serviceAccount.name is required when webhook.serviceAccount.create is false" .Values.webhook.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "graceful-drain.agent.serviceAccountName" -}}
{{- if .Values.agent.serviceAccount.create -}}
{{- default (include "graceful-drain.agent.name" .) .Values.agent.serviceAccount.name -}}
{{- else -}}
{{- required "agent.serviceAccount.name is required when agent.serviceAccount.create is false" .Values.agent.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "graceful-drain.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}
{{- end -}}

{{/* Name of the Secret holding the webhook's serving certificate. */}}
{{- define "graceful-drain.tlsSecretName" -}}
{{- if eq .Values.certificates.mode "secret" -}}
{{- required "certificates.secret.name is required when certificates.mode is secret" .Values.certificates.secret.name -}}
{{- else -}}
{{- printf "%s-tls" (include "graceful-drain.webhook.name" .) -}}
{{- end -}}
{{- end -}}

{{/* The DNS names under which the API server reaches the webhook Service. */}}
{{- define "graceful-drain.webhook.dnsNames" -}}
{{- $svc := include "graceful-drain.webhook.name" . -}}
{{- $ns := .Release.Namespace -}}
{{- list $svc (printf "%s.%s" $svc $ns) (printf "%s.%s.svc" $svc $ns) (printf "%s.%s.svc.cluster.local" $svc $ns) | toJson -}}
{{- end -}}

{{/* RUST_LOG of both workloads: a level applies to graceful-drain's own crates (a target
matches by prefix, so graceful_drain covers graceful_drain_core, _webhook and _agent) and
leaves every other crate at warn, as the binary's default filter does; a value holding "="
is a whole filter. */}}
{{- define "graceful-drain.rustLog" -}}
{{- if contains "=" .Values.logLevel -}}
{{- .Values.logLevel -}}
{{- else -}}
{{- printf "warn,graceful_drain=%s" .Values.logLevel -}}
{{- end -}}
{{- end -}}

{{/* "true" when .Capabilities is Helm's built-in offline set (helm template or lint
without a cluster) rather than a cluster's discovery. That set comes from client-go's
scheme and still lists extensions/v1beta1 and policy/v1beta1, which no Kubernetes the
chart supports serves (removed in 1.22 and 1.25) and no CRD can claim (a CRD's group
needs a dot). `--api-versions` only adds to it. */}}
{{- define "graceful-drain.offlineCapabilities" -}}
{{- if and (.Capabilities.APIVersions.Has "extensions/v1beta1") (.Capabilities.APIVersions.Has "policy/v1beta1") -}}
true
{{- end -}}
{{- end -}}

{{/*
Variables of the policies on the webhook's own RBAC objects: its metadata may change only
by owner references and finalizers, labels and annotations kept; finalizersAdded lists the
finalizers the request adds (each policy says which, if any, it allows).
*/}}
{{- define "graceful-drain.ownRbacVariables" -}}
- name: metadataKept
  expression: >-
    (has(object.metadata.labels) ? object.metadata.labels : {}) == (has(oldObject.metadata.labels) ? oldObject.metadata.labels : {}) &&
    (has(object.metadata.annotations) ? object.metadata.annotations : {}) == (has(oldObject.metadata.annotations) ? oldObject.metadata.annotations : {})
- name: finalizersAdded
  expression: >-
    (has(object.metadata.finalizers) ? object.metadata.finalizers : []).filter(f, !(f in (has(oldObject.metadata.finalizers) ? oldObject.metadata.finalizers : [])))
{{- end }}
