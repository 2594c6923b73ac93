{{/*
The alert rules: the one source of the PrometheusRule (prometheusrule.yaml) and of
helm/monitoring/alerts.yaml (`python scripts/monitoring.py` renders it from here with the default
values). docs/operations.md, "Alerts", has a section for each alert, which its runbook_url
names. Prometheus' own templates ({{ $labels.x }}, {{ $value }}) are written as {{`...`}}.
*/}}

{{/* for, labels and runbook_url of one rule. Call with (list $ "AlertName"). */}}
{{- define "mqtt-offload.alertCommon" -}}
{{- $root := index . 0 }}
{{- $name := index . 1 }}
{{- $rule := index $root.Values.alerts.rules $name -}}
for: {{ $rule.for }}
labels:
  severity: {{ $rule.severity }}
  {{- with $root.Values.alerts.extraLabels }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
{{- end }}

{{- define "mqtt-offload.runbook" -}}
{{- $root := index . 0 }}
{{- printf "%s#%s" $root.Values.alerts.runbookUrl (lower (index . 1)) | quote }}
{{- end }}

{{- define "mqtt-offload.alertGroups" -}}
{{- $r := .Values.alerts.rules }}
{{- $sel := tpl .Values.alerts.selector . }}
{{- /* $b: the matchers of a bare selector ({...} or nothing); $c: appended to others */}}
{{- $b := ternary (printf "{%s}" $sel) "" (ne $sel "") }}
{{- $c := ternary (printf ",%s" $sel) "" (ne $sel "") }}
{{- $jobs := tpl .Values.alerts.jobs . -}}
groups:
- name: mqtt-offload-gateway
  rules:
  {{- if $r.OffloadStoreDown.enabled }}
  - alert: OffloadStoreDown
    expr: offload_store_up{{ $b }} == 0
    {{- include "mqtt-offload.alertCommon" (list $ "OffloadStoreDown") | nindent 4 }}
    annotations:
      summary: The gateway cannot reach its object store; check the store's health, then the storage URL, credentials and bucket.
      description: Every store probe of {{`{{ $labels.instance }}`}} failed for {{ $r.OffloadStoreDown.for }}; uploads and downloads fail with 503 and the pod is not ready.
      runbook_url: {{ include "mqtt-offload.runbook" (list $ "OffloadStoreDown") }}
  {{- end }}
  {{- if $r.OffloadStoreErrors.enabled }}
  - alert: OffloadStoreErrors
    expr: rate(offload_storage_errors_total{{ $b }}[5m]) > {{ $r.OffloadStoreErrors.perSecond }}
    {{- include "mqtt-offload.alertCommon" (list $ "OffloadStoreErrors") | nindent 4 }}
    annotations:
      summary: Object store operations keep failing; read the gateway's log for the store's errors and check the store's own health and capacity.
      description: '{{`{{ $labels.instance }}`}} counts {{`{{ $value | humanize }}`}} failed store operations per second.'
      runbook_url: {{ include "mqtt-offload.runbook" (list $ "OffloadStoreErrors") }}
  {{- end }}
  {{- if $r.OffloadBrokerLinkDown.enabled }}
  - alert: OffloadBrokerLinkDown
    expr: offload_broker_up{{ $b }} == 0
    {{- include "mqtt-offload.alertCommon" (list $ "OffloadBrokerLinkDown") | nindent 4 }}
    annotations:
      summary: The gateway's broker link is down; check the broker, then the gateway's broker URL, user and TLS settings.
      description: '{{`{{ $labels.instance }}`}} has not been connected to the broker for {{ $r.OffloadBrokerLinkDown.for }}: no placeholder or discovery record is published.'
      runbook_url: {{ include "mqtt-offload.runbook" (list $ "OffloadBrokerLinkDown") }}
  {{- end }}
  {{- if $r.OffloadBrokerPublishFailures.enabled }}
  - alert: OffloadBrokerPublishFailures
    expr: rate(offload_broker_errors_total{{ $b }}[5m]) > {{ $r.OffloadBrokerPublishFailures.perSecond }}
    {{- include "mqtt-offload.alertCommon" (list $ "OffloadBrokerPublishFailures") | nindent 4 }}
    annotations:
      summary: The broker keeps refusing or dropping the gateway's publishes; check the broker's log and the gateway user's ACL.
      description: '{{`{{ $labels.instance }}`}} fails {{`{{ $value | humanize }}`}} publishes per second; each failed HTTP publish was withdrawn and answered 503.'
      runbook_url: {{ include "mqtt-offload.runbook" (list $ "OffloadBrokerPublishFailures") }}
  {{- end }}
  {{- if $r.OffloadHttp5xx.enabled }}
  - alert: OffloadHttp5xx
    expr: |-
      sum by (namespace, job, method, route) (rate(offload_http_requests_total{status=~"5.."{{ $c }}}[5m]))
        / sum by (namespace, job, method, route) (rate(offload_http_requests_total{{ $b }}[5m]))
        > {{ $r.OffloadHttp5xx.ratio }}
    {{- include "mqtt-offload.alertCommon" (list $ "OffloadHttp5xx") | nindent 4 }}
    annotations:
      summary: The gateway answers a share of requests with 5xx; check the store and broker alerts first, then transfer saturation (503) and the log's errors.
      description: '{{`{{ $labels.method }} {{ $labels.route }}`}}: {{`{{ $value | humanizePercentage }}`}} of responses are 5xx.'
      runbook_url: {{ include "mqtt-offload.runbook" (list $ "OffloadHttp5xx") }}
  {{- end }}
  {{- if $r.OffloadLatencyHigh.enabled }}
  {{- $routes := $r.OffloadLatencyHigh.routes | default dict }}
  {{- $own := list }}
  {{- range $route, $_ := $routes }}{{ $own = append $own (regexQuoteMeta $route) }}{{ end }}
  {{- $others := ternary (printf ",route!~`%s`" (join "|" $own)) "" (gt (len $own) 0) }}
  {{- $thresholds := list (list $others $r.OffloadLatencyHigh.seconds "") }}
  {{- range $route, $seconds := $routes }}
  {{- $thresholds = append $thresholds (list (printf ",route=%s" (quote $route)) $seconds $route) }}
  {{- end }}
  {{- range $thresholds }}
  - alert: OffloadLatencyHigh
    expr: |-
      histogram_quantile(0.99,
        sum by (namespace, job, method, route, le) (rate(offload_http_request_seconds_bucket{ {{- trimPrefix "," (printf "%s%s" (index . 0) $c) -}} }[5m])))
        > {{ index . 1 }}
    {{- include "mqtt-offload.alertCommon" (list $ "OffloadLatencyHigh") | nindent 4 }}
    {{- with index . 2 }}
      route: {{ quote . }}  # the rule of this route's own threshold
    {{- end }}
    annotations:
      summary: A route's p99 latency is over its threshold; open a slow request's trace from the dashboard's exemplars to see which hop takes the time.
      description: '{{`{{ $labels.method }} {{ $labels.route }}`}}: p99 {{`{{ $value | humanizeDuration }}`}}, over {{ index . 1 }} s.'
      runbook_url: {{ include "mqtt-offload.runbook" (list $ "OffloadLatencyHigh") }}
  {{- end }}
  {{- end }}
  {{- if $r.OffloadLoginsRefusedSurge.enabled }}
  - alert: OffloadLoginsRefusedSurge
    expr: |-
      sum by (namespace, job) (rate(offload_auth_failures_total{status="401"{{ $c }}}[5m]))
        > {{ $r.OffloadLoginsRefusedSurge.perSecond }}
    {{- include "mqtt-offload.alertCommon" (list $ "OffloadLoginsRefusedSurge") | nindent 4 }}
    annotations:
      summary: Refused logins are surging; find the addresses in the gateway's log and block a guesser upstream, or fix the clients holding stale credentials.
      description: '{{`{{ $labels.job }}`}} refuses {{`{{ $value | humanize }}`}} logins per second.'
      runbook_url: {{ include "mqtt-offload.runbook" (list $ "OffloadLoginsRefusedSurge") }}
  {{- end }}
  {{- if $r.OffloadSweeperFailing.enabled }}
  {{- $stale := int $r.OffloadSweeperFailing.staleSeconds }}
  - alert: OffloadSweeperFailing
    expr: |-
      (
        sum without (result) (increase(offload_sweeper_runs_total{result="failed"{{ $c }}}[{{ $stale }}s])) > 0
          unless sum without (result) (increase(offload_sweeper_runs_total{result="ok"{{ $c }}}[{{ $stale }}s])) > 0
      )
      or time() - (offload_sweeper_last_success_timestamp_seconds{{ $b }} > 0) > {{ $stale }}
    {{- include "mqtt-offload.alertCommon" (list $ "OffloadSweeperFailing") | nindent 4 }}
    annotations:
      summary: The retention sweeper has not finished a sweep for a long time; read its warnings in the gateway's log (gateway.sweeper) and check the store.
      description: '{{`{{ $labels.instance }}`}} has finished no sweep in {{ $stale }} s; expired payloads and abandoned uploads stay in the bucket meanwhile.'
      runbook_url: {{ include "mqtt-offload.runbook" (list $ "OffloadSweeperFailing") }}
  {{- end }}
- name: mqtt-offload-proxy
  rules:
  {{- if $r.OffloadProxyBrokerUnreachable.enabled }}
  - alert: OffloadProxyBrokerUnreachable
    expr: rate(offload_proxy_refused_connections_total{why="broker-unreachable"{{ $c }}}[5m]) > 0
    {{- include "mqtt-offload.alertCommon" (list $ "OffloadProxyBrokerUnreachable") | nindent 4 }}
    annotations:
      summary: The proxy cannot reach the broker and refuses devices' connections; check the broker, then the proxy's broker address and the network between them.
      description: '{{`{{ $labels.instance }}`}} refuses {{`{{ $value | humanize }}`}} connections per second (CONNACK 0x88).'
      runbook_url: {{ include "mqtt-offload.runbook" (list $ "OffloadProxyBrokerUnreachable") }}
  {{- end }}
  {{- if $r.OffloadProxyLatencyHigh.enabled }}
  {{- $p := $r.OffloadProxyLatencyHigh }}
  {{- range $operation, $seconds := dict "offload" $p.offloadSeconds "fetch" $p.fetchSeconds }}
  {{- $plural := ternary "offloads" "fetches" (eq $operation "offload") }}
  - alert: OffloadProxyLatencyHigh
    expr: |-
      histogram_quantile(0.99,
        sum by (namespace, job, instance, le) (rate(offload_proxy_{{ $operation }}_seconds_bucket{{ $b }}[5m])))
        > {{ $seconds }}
    {{- include "mqtt-offload.alertCommon" (list $ "OffloadProxyLatencyHigh") | nindent 4 }}
      operation: {{ $operation }}
    annotations:
      summary: The proxy's {{ $plural }} are slow; check the gateway's latency alerts, then open a slow {{ $operation }}'s trace from the dashboard's exemplars.
      description: '{{`{{ $labels.instance }}`}}: p99 of {{ $plural }} {{`{{ $value | humanizeDuration }}`}}, over {{ $seconds }} s.'
      runbook_url: {{ include "mqtt-offload.runbook" (list $ "OffloadProxyLatencyHigh") }}
  {{- end }}
  {{- end }}
  {{- if $r.OffloadProxySharesFull.enabled }}
  - alert: OffloadProxySharesFull
    expr: |-
      sum by (namespace, job, instance, pool, share) (rate(offload_proxy_shares_full_total{{ $b }}[1m]))
        > {{ $r.OffloadProxySharesFull.perSecond }}
    {{- include "mqtt-offload.alertCommon" (list $ "OffloadProxySharesFull") | nindent 4 }}
    annotations:
      summary: A proxy pool or share has been full for minutes; if share is total, add proxy replicas or raise the pool's limit; if user or address, find that device or account in the proxy's log.
      description: '{{`{{ $labels.instance }}`}}: pool {{`{{ $labels.pool }}`}}, share {{`{{ $labels.share }}`}}, {{`{{ $value | humanize }}`}} refusals or waits per second.'
      runbook_url: {{ include "mqtt-offload.runbook" (list $ "OffloadProxySharesFull") }}
  {{- end }}
  {{- if $r.OffloadProxyOffloadFailures.enabled }}
  - alert: OffloadProxyOffloadFailures
    expr: |-
      sum by (namespace, job, instance, why) (rate(offload_proxy_offload_failures_total{why!~"4..|resend-differs"{{ $c }}}[5m]))
        > {{ $r.OffloadProxyOffloadFailures.perSecond }}
    {{- include "mqtt-offload.alertCommon" (list $ "OffloadProxyOffloadFailures") | nindent 4 }}
    annotations:
      summary: The proxy cannot store large messages at the gateway; check the gateway's alerts (store, 5xx), then the proxy's gateway endpoint and CA.
      description: '{{`{{ $labels.instance }}`}}: {{`{{ $value | humanize }}`}} offloads per second fail ({{`{{ $labels.why }}`}}); devices get PUBACK 0x80 or lose the connection.'
      runbook_url: {{ include "mqtt-offload.runbook" (list $ "OffloadProxyOffloadFailures") }}
  {{- end }}
  {{- if $r.OffloadProxyFetchFailures.enabled }}
  - alert: OffloadProxyFetchFailures
    expr: |-
      sum by (namespace, job, instance, why) (rate(offload_proxy_placeholders_passed_total{why=~"fetch-failed|no-endpoint"{{ $c }}}[5m]))
        > {{ $r.OffloadProxyFetchFailures.perSecond }}
    {{- include "mqtt-offload.alertCommon" (list $ "OffloadProxyFetchFailures") | nindent 4 }}
    annotations:
      summary: The proxy hands devices placeholders it could not resolve; check the gateway's alerts, then whether the payloads expired before their subscribers read them.
      description: '{{`{{ $labels.instance }}`}}: {{`{{ $value | humanize }}`}} placeholders per second passed unresolved ({{`{{ $labels.why }}`}}).'
      runbook_url: {{ include "mqtt-offload.runbook" (list $ "OffloadProxyFetchFailures") }}
  {{- end }}
- name: mqtt-offload-targets
  rules:
  {{- if $r.OffloadTlsCertificateExpiring.enabled }}
  - alert: OffloadTlsCertificateExpiring
    expr: |-
      offload_tls_certificate_expiry_timestamp_seconds{{ $b }} - time()
        < {{ mul (int $r.OffloadTlsCertificateExpiring.days) 86400 }}
    {{- include "mqtt-offload.alertCommon" (list $ "OffloadTlsCertificateExpiring") | nindent 4 }}
    annotations:
      summary: A certificate the gateway or the proxy presents expires soon; renew it, then restart the pods, which read it at start.
      description: '{{`{{ $labels.job }} {{ $labels.instance }}`}}: the {{`{{ $labels.certificate }}`}} certificate expires in {{`{{ $value | humanizeDuration }}`}}.'
      runbook_url: {{ include "mqtt-offload.runbook" (list $ "OffloadTlsCertificateExpiring") }}
  {{- end }}
  {{- if $r.OffloadTargetDown.enabled }}
  - alert: OffloadTargetDown
    expr: up{job=~{{ $jobs | quote }}{{ $c }}} == 0
    {{- include "mqtt-offload.alertCommon" (list $ "OffloadTargetDown") | nindent 4 }}
    annotations:
      summary: Prometheus cannot scrape a gateway or proxy replica; check the pod (crash loop, OOM kill) and its metrics port, then the NetworkPolicy.
      description: '{{`{{ $labels.job }} {{ $labels.instance }}`}} has not answered a scrape for {{ $r.OffloadTargetDown.for }}.'
      runbook_url: {{ include "mqtt-offload.runbook" (list $ "OffloadTargetDown") }}
  {{- end }}
{{- end }}
