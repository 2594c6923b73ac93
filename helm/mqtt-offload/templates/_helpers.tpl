{{/* Names, labels and the small computations the templates share. */}}

{{- define "mqtt-offload.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "mqtt-offload.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "mqtt-offload.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "mqtt-offload.selectorLabels" -}}
app.kubernetes.io/name: {{ include "mqtt-offload.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: gateway
{{- end }}

{{- define "mqtt-offload.labels" -}}
helm.sh/chart: {{ include "mqtt-offload.chart" . }}
{{ include "mqtt-offload.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: mqtt-offload
{{- end }}

{{- define "mqtt-offload.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "mqtt-offload.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "mqtt-offload.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{/* The container port; fixed because the image's command line and the probes agree on it. */}}
{{- define "mqtt-offload.containerPort" -}}8080{{- end }}

{{- /* The gateway's metrics port (OFFLOAD_METRICS_PORT): Prometheus only, never the API's. */}}
{{- define "mqtt-offload.metricsPort" -}}9090{{- end }}

{{- define "mqtt-offload.scheme" -}}
{{- if .Values.tls.enabled }}HTTPS{{ else }}HTTP{{ end }}
{{- end }}

{{/*
The URL clients are told to use: explicit, else the first Ingress host, else the Service.
*/}}
{{- define "mqtt-offload.publicUrl" -}}
{{- if .Values.gateway.publicUrl }}
{{- .Values.gateway.publicUrl }}
{{- else if and .Values.ingress.enabled .Values.ingress.hosts }}
{{- $host := (first .Values.ingress.hosts).host }}
{{- $secure := false }}
{{- range .Values.ingress.tls }}
{{- if has $host .hosts }}{{ $secure = true }}{{ end }}
{{- end }}
{{- printf "%s://%s" (ternary "https" "http" $secure) $host }}
{{- else }}
{{- $scheme := ternary "https" "http" .Values.tls.enabled }}
{{- $port := int .Values.service.port }}
{{- $suffix := ternary "" (printf ":%d" $port) (eq $port (ternary 443 80 .Values.tls.enabled)) }}
{{- printf "%s://%s.%s.svc%s" $scheme (include "mqtt-offload.fullname" .) .Release.Namespace $suffix }}
{{- end }}
{{- end }}

{{/*
The TCP port in a storage or broker URL, with the scheme's default when the URL names none.
Call with (list URL DEFAULT_PORT).
*/}}
{{- define "mqtt-offload.urlPort" -}}
{{- $url := urlParse (index . 0) }}
{{- $parts := splitList ":" $url.host }}
{{- if gt (len $parts) 1 }}{{ last $parts }}{{ else }}{{ index . 1 }}{{ end }}
{{- end }}

{{- define "mqtt-offload.storagePort" -}}
{{- $default := ternary 443 80 (contains "secure=true" .Values.storage.url) }}
{{- include "mqtt-offload.urlPort" (list .Values.storage.url $default) }}
{{- end }}

{{- define "mqtt-offload.mqttPort" -}}
{{- $default := ternary 8883 1883 (hasPrefix "mqtts://" .Values.mqtt.url) }}
{{- include "mqtt-offload.urlPort" (list .Values.mqtt.url $default) }}
{{- end }}

{{/* Name of the chart-managed Secret. */}}
{{- define "mqtt-offload.secretName" -}}
{{- include "mqtt-offload.fullname" . }}
{{- end }}

{{/*
The file-shaped settings the pod mounts, each from the chart's Secret or an existing one.
Rendered as a YAML list of {name, env, secret, key, path} for the rows that are configured.
*/}}
{{- define "mqtt-offload.files" -}}
{{- $own := include "mqtt-offload.secretName" . }}
{{- $rows := list }}
{{- range $name, $env := dict "passwordFile" "OFFLOAD_PASSWORD_FILE" "aclFile" "OFFLOAD_ACL_FILE" "tokensFile" "OFFLOAD_TOKENS_FILE" "dynsecFile" "OFFLOAD_DYNSEC_FILE" "jwksFile" "OFFLOAD_JWKS_FILE" "jwtSecretFile" "OFFLOAD_JWT_SECRET_FILE" }}
{{- $f := index $.Values.auth $name }}
{{- if $f.existingSecret }}
{{- $rows = append $rows (dict "name" $name "env" $env "secret" $f.existingSecret "key" $f.existingSecretKey "path" (snakecase $name)) }}
{{- else if $f.content }}
{{- $rows = append $rows (dict "name" $name "env" $env "secret" $own "key" (snakecase $name) "path" (snakecase $name)) }}
{{- end }}
{{- end }}
{{- toYaml $rows }}
{{- end }}

{{/* Mount point of the projected auth files. */}}
{{- define "mqtt-offload.authDir" -}}/etc/mqtt-offload/auth{{- end }}
{{- define "mqtt-offload.tlsDir" -}}/etc/mqtt-offload/tls{{- end }}
{{- define "mqtt-offload.retentionDir" -}}/etc/mqtt-offload/retention{{- end }}

{{/* Fail early on settings that would render a pod that cannot work. */}}
{{- define "mqtt-offload.validate" -}}
{{- if and .Values.storage.existingSecret (or .Values.storage.accessKey .Values.storage.secretKey) }}
{{- fail "storage: set either accessKey/secretKey or existingSecret, not both" }}
{{- end }}
{{- if and .Values.mqtt.existingSecret (or .Values.mqtt.username .Values.mqtt.password) }}
{{- fail "mqtt: set either username/password or existingSecret, not both" }}
{{- end }}
{{- if and .Values.auth.existingSecret .Values.auth.secret }}
{{- fail "auth: set either secret or existingSecret, not both" }}
{{- end }}
{{- range $name := list "passwordFile" "aclFile" "tokensFile" "dynsecFile" "jwksFile" "jwtSecretFile" }}
{{- $f := index $.Values.auth $name }}
{{- if and $f.existingSecret $f.content }}
{{- fail (printf "auth.%s: set either content or existingSecret, not both" $name) }}
{{- end }}
{{- end }}
{{- $a := .Values.auth }}
{{- $dynsec := or $a.dynsecFile.content $a.dynsecFile.existingSecret }}
{{- $passwords := or $a.passwordFile.content $a.passwordFile.existingSecret $dynsec }}
{{- $jwt := or $a.jwksFile.content $a.jwksFile.existingSecret $a.jwtSecretFile.content $a.jwtSecretFile.existingSecret $a.jwt.jwksUrl }}
{{- $tokens := or $a.tokensFile.content $a.tokensFile.existingSecret $jwt }}
{{- $https := or .Values.tls.enabled (hasPrefix "https://" (include "mqtt-offload.publicUrl" .)) }}
{{- if and $dynsec (or $a.passwordFile.content $a.passwordFile.existingSecret $a.aclFile.content $a.aclFile.existingSecret) }}
{{- fail "auth.dynsecFile holds the users and the rules: set it without auth.passwordFile and auth.aclFile" }}
{{- end }}
{{- if and $tokens (not $passwords) (not $https) }}
{{- fail "auth.tokensFile without auth.passwordFile (or JWT keys without auth.passwordFile or auth.dynsecFile) takes bearer tokens only, which the gateway refuses over plain HTTP (it would not start): enable tls, an Ingress with tls, an https gateway.publicUrl, or add auth.passwordFile" }}
{{- end }}
{{- if and .Values.tls.enabled (not .Values.tls.existingSecret) }}
{{- fail "tls.enabled needs tls.existingSecret (a kubernetes.io/tls Secret)" }}
{{- end }}
{{- if and .Values.podDisruptionBudget.enabled (not (kindIs "invalid" .Values.podDisruptionBudget.minAvailable)) (not (kindIs "invalid" .Values.podDisruptionBudget.maxUnavailable)) }}
{{- fail "podDisruptionBudget: set minAvailable or maxUnavailable, not both" }}
{{- end }}
{{- end }}

{{/* offload-proxy: its own component, so the gateway's selectors never match its pods. */}}
{{- define "mqtt-offload.proxySelectorLabels" -}}
app.kubernetes.io/name: {{ include "mqtt-offload.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: proxy
{{- end }}

{{- define "mqtt-offload.proxyLabels" -}}
helm.sh/chart: {{ include "mqtt-offload.chart" . }}
{{ include "mqtt-offload.proxySelectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: mqtt-offload
{{- end }}

{{/*
The bytes a Kubernetes quantity names ("1Gi", "1500Mi", "1.5G", "1073741824"), the forms
values.schema.json admits for tmp.sizeLimit.
*/}}
{{- define "mqtt-offload.bytes" -}}
{{- $number := regexFind "^[0-9]+(\\.[0-9]+)?" . }}
{{- $scale := dict "" 1 "k" 1e3 "M" 1e6 "G" 1e9 "T" 1e12 "Ki" 1024 "Mi" 1048576 "Gi" 1073741824 "Ti" 1099511627776 }}
{{- $suffix := trimPrefix $number . }}
{{- if or (not $number) (not (hasKey $scale $suffix)) }}
{{- fail (printf "cannot read the quantity %q: give bytes, or a number with Ki, Mi, Gi, Ti, k, M, G or T" .) }}
{{- end }}
{{- mulf $number (get $scale $suffix) | int64 }}
{{- end }}

{{/*
offload-proxy spools a broadcast's payload beyond sharedMemoryBytes to the pod's /tmp, up to
maxSharedBytes per process (docs/proxy.md, "One fetch for a broadcast"): an emptyDir past its
sizeLimit gets the pod evicted, every device behind it cut off.
*/}}
{{- define "mqtt-offload.proxyTmpFits" -}}
{{- $p := .Values.proxy }}
{{- with .Values.tmp.sizeLimit }}
{{- $limit := include "mqtt-offload.bytes" . | int64 }}
{{- $shared := int64 $p.maxSharedBytes }}
{{- $spooled := mul $p.workers (sub $shared (min $shared (int64 $p.sharedMemoryBytes))) }}
{{- if ge $spooled $limit }}
{{- fail (printf "proxy: its %v workers may spool %d MiB of broadcast payloads to /tmp (each maxSharedBytes - sharedMemoryBytes), not under tmp.sizeLimit (%s): the pod would be evicted; raise tmp.sizeLimit or sharedMemoryBytes (with the memory limit), or lower maxSharedBytes" $p.workers (div $spooled 1048576) .) }}
{{- end }}
{{- end }}
{{- end }}
