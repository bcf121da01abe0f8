{{/*
Shared helpers. Names come from config.run.name (not the release name) so that they match the
coordinator host and certificate SANs that `lensemble certs init` writes for the same config.
*/}}

{{/* The run name: prefix of every object name. */}}
{{- define "lensemble.run" -}}
{{- required "config.run.name is missing: render the values with `lensemble render helm-values --config FILE`" .Values.config.run.name -}}
{{- end -}}

{{/* Distinct trust domains of the config, sorted, as JSON. */}}
{{- define "lensemble.allTrustDomains" -}}
{{- $tds := list -}}
{{- range .Values.config.federation.participants -}}
{{- $tds = append $tds .trust_domain -}}
{{- end -}}
{{- $tds | uniq | sortAlpha | toJson -}}
{{- end -}}

{{/* Trust domains this release installs participants for, as JSON. */}}
{{- define "lensemble.trustDomains" -}}
{{- if eq .Values.mode "all" -}}
{{- include "lensemble.allTrustDomains" . -}}
{{- else if eq .Values.mode "participant" -}}
{{- list .Values.trustDomain | toJson -}}
{{- else -}}
{{- list | toJson -}}
{{- end -}}
{{- end -}}

{{/* Whether this release installs the coordinator ("true" or ""). */}}
{{- define "lensemble.hasCoordinator" -}}
{{- if has .Values.mode (list "all" "coordinator") -}}true{{- end -}}
{{- end -}}

{{/* Participant ids of one trust domain, in config order (the StatefulSet ordinal order). */}}
{{- define "lensemble.participantsOf" -}}
{{- $ids := list -}}
{{- range .root.Values.config.federation.participants -}}
{{- if eq .trust_domain $.td -}}
{{- $ids = append $ids .id -}}
{{- end -}}
{{- end -}}
{{- $ids | toJson -}}
{{- end -}}

{{/*
Object names come from .Values.names, which `lensemble render helm-values` computes
(lensemble.render.names): the chart computes no name itself.
*/}}
{{- define "lensemble.coordinatorName" -}}
{{- required "names.coordinator.name is missing: render the values with `lensemble render helm-values --config FILE`." .Values.names.coordinator.name -}}
{{- end -}}

{{- define "lensemble.coordinatorNamespace" -}}
{{- required "names.coordinator.namespace is missing: render the values with `lensemble render helm-values --config FILE`." .Values.names.coordinator.namespace -}}
{{- end -}}

{{/* One trust domain's names (name, namespace). Call with (dict "root" $ "td" "..."). */}}
{{- define "lensemble.participantNames" -}}
{{- $entry := get .root.Values.names.participants .td -}}
{{- if not $entry -}}
{{- /* A trust domain the config does not have is named by the checks; else names are stale. */ -}}
{{- include "lensemble.validate" .root -}}
{{- fail (printf "names.participants has no '%s': render the values with `lensemble render helm-values --config FILE`." .td) -}}
{{- end -}}
{{- toJson $entry -}}
{{- end -}}

{{/* StatefulSet (and Service, ServiceAccount) name of one trust domain. */}}
{{- define "lensemble.participantName" -}}
{{- (include "lensemble.participantNames" . | fromJson).name -}}
{{- end -}}

{{- define "lensemble.participantNamespace" -}}
{{- (include "lensemble.participantNames" . | fromJson).namespace -}}
{{- end -}}

{{/* Namespaces this release uses, sorted, as JSON. */}}
{{- define "lensemble.namespaces" -}}
{{- $out := list -}}
{{- if include "lensemble.hasCoordinator" . -}}
{{- $out = append $out (include "lensemble.coordinatorNamespace" .) -}}
{{- end -}}
{{- range (include "lensemble.trustDomains" . | fromJsonArray) -}}
{{- $out = append $out (include "lensemble.participantNamespace" (dict "root" $ "td" .)) -}}
{{- end -}}
{{- $out | uniq | sortAlpha | toJson -}}
{{- end -}}

{{/* Name prefix of per-namespace objects: the run in mode all, else the installed unit. */}}
{{- define "lensemble.releasePrefix" -}}
{{- if eq .Values.mode "all" -}}
{{- include "lensemble.run" . -}}
{{- else if eq .Values.mode "coordinator" -}}
{{- include "lensemble.coordinatorName" . -}}
{{- else -}}
{{- include "lensemble.participantName" (dict "root" . "td" .Values.trustDomain) -}}
{{- end -}}
{{- end -}}

{{/* Labels every object carries. Call with (dict "root" $ "component" "..." ["td" "..."]). */}}
{{- define "lensemble.labels" -}}
app.kubernetes.io/name: lensemble
app.kubernetes.io/part-of: lensemble
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
lensemble.dev/run: {{ include "lensemble.run" .root }}
lensemble.dev/environment: {{ .root.Values.config.deployment.environment }}
{{- if .component }}
app.kubernetes.io/component: {{ .component }}
{{- end }}
{{- if .td }}
lensemble.dev/trust-domain: {{ .td }}
{{- end }}
{{- end -}}

{{/* Selector labels (stable across upgrades). Same arguments as lensemble.labels. */}}
{{- define "lensemble.selectorLabels" -}}
app.kubernetes.io/name: lensemble
lensemble.dev/run: {{ include "lensemble.run" .root }}
app.kubernetes.io/component: {{ .component }}
{{- if .td }}
lensemble.dev/trust-domain: {{ .td }}
{{- end }}
{{- end -}}

{{/* The image reference: knobs first, else config.deployment.image. */}}
{{- define "lensemble.image" -}}
{{- $cfg := .Values.config.deployment.image -}}
{{- printf "%s:%s" (.Values.image.repository | default $cfg.repository) (.Values.image.tag | default $cfg.tag) -}}
{{- end -}}

{{- define "lensemble.pullPolicy" -}}
{{- .Values.image.pullPolicy | default .Values.config.deployment.image.pull_policy -}}
{{- end -}}

{{/* Container resources of a role. Call with (dict "root" $ "role" "coordinator"). */}}
{{- define "lensemble.resources" -}}
{{- $override := get .root.Values.resources .role -}}
{{- if or $override.requests $override.limits -}}
{{- toYaml $override -}}
{{- else -}}
{{- $r := get .root.Values.config.deployment.resources .role -}}
requests:
  cpu: {{ $r.cpu | quote }}
  memory: {{ $r.memory | quote }}
  {{- if gt (int $r.gpu) 0 }}
  nvidia.com/gpu: {{ int $r.gpu }}
  {{- end }}
limits:
  memory: {{ $r.memory | quote }}
  {{- if gt (int $r.gpu) 0 }}
  nvidia.com/gpu: {{ int $r.gpu }}
  {{- end }}
{{- end -}}
{{- end -}}

{{- define "lensemble.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: {{ int .Values.podSecurity.runAsUser }}
runAsGroup: {{ int .Values.podSecurity.runAsGroup }}
fsGroup: {{ int .Values.podSecurity.fsGroup }}
fsGroupChangePolicy: OnRootMismatch
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{- define "lensemble.containerSecurityContext" -}}
runAsNonRoot: true
readOnlyRootFilesystem: true
allowPrivilegeEscalation: false
privileged: false
capabilities:
  drop:
    - ALL
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{/* Secret holding one identity's TLS material. Call with (dict "root" $ "identity" "..."). */}}
{{- define "lensemble.tlsSecret" -}}
{{- $override := .root.Values.tls.secretNames -}}
{{- if hasKey $override .identity -}}
{{- get $override .identity -}}
{{- else -}}
{{- required (printf "names.tlsSecrets.%s is missing: render the values with `lensemble render helm-values --config FILE`." .identity) (get .root.Values.names.tlsSecrets .identity) -}}
{{- end -}}
{{- end -}}

{{/*
Projected volume of the identities' TLS Secrets: /etc/lensemble/tls/<identity>/... With
tls.caBundleSecret set, every identity's ca.crt comes from that Secret's ca.crt instead.
Call with (dict "root" $ "identities" IDS).
*/}}
{{- define "lensemble.tlsVolume" -}}
{{- $bundle := .root.Values.tls.caBundleSecret -}}
- name: tls
  projected:
    defaultMode: 0440
    sources:
      {{- range .identities }}
      - secret:
          name: {{ include "lensemble.tlsSecret" (dict "root" $.root "identity" .) }}
          items:
            - key: tls.crt
              path: {{ . }}/tls.crt
            - key: tls.key
              path: {{ . }}/tls.key
            {{- if not $bundle }}
            - key: ca.crt
              path: {{ . }}/ca.crt
            {{- end }}
      {{- if $bundle }}
      - secret:
          name: {{ $bundle }}
          items:
            - key: ca.crt
              path: {{ . }}/ca.crt
      {{- end }}
      {{- end }}
{{- end -}}

{{/* Environment every process gets. Call with (dict "root" $ "role" "..."). */}}
{{- define "lensemble.env" -}}
- name: LENSEMBLE_ROLE
  value: {{ .role }}
- name: LENSEMBLE_CONFIG
  value: /etc/lensemble/config.yaml
- name: LENSEMBLE_LINGER
  value: "true"
{{- end -}}

{{/* The run-record signing key of the coordinator (docs/run-record.md): KMS or a mounted HMAC key. */}}
{{- define "lensemble.runRecordEnv" -}}
{{- $rr := .Values.coordinator.runRecord -}}
{{- if and $rr.kmsKeyId $rr.keySecret -}}
{{- fail "coordinator.runRecord: set kmsKeyId or keySecret, not both (the coordinator signs with one key)" -}}
{{- end -}}
{{- if $rr.kmsKeyId -}}
- name: LENSEMBLE_LEDGER_KMS_KEY_ID
  value: {{ $rr.kmsKeyId | quote }}
{{- else if $rr.keySecret -}}
- name: LENSEMBLE_LEDGER_KEY_FILE
  value: /etc/lensemble/run-record/key
{{- end -}}
{{- end -}}

{{/*
Ports every process serves; the coordinator also serves gRPC and, unless
config.network.download_port is null, the model download.
*/}}
{{- define "lensemble.ports" -}}
{{- $net := .root.Values.config.network -}}
{{- if eq .role "coordinator" -}}
- name: grpc
  containerPort: {{ int $net.port }}
  protocol: TCP
{{ with $net.download_port -}}
- name: download
  containerPort: {{ int . }}
  protocol: TCP
{{ end -}}
{{ end -}}
- name: health
  containerPort: {{ int $net.health_port }}
  protocol: TCP
- name: metrics
  containerPort: {{ int $net.metrics_port }}
  protocol: TCP
{{- end -}}

{{/* Native gRPC probes on the plaintext health port (service "" = live, lensemble.Readiness = ready). */}}
{{- define "lensemble.probes" -}}
{{- $port := int .Values.config.network.health_port -}}
startupProbe:
  grpc:
    port: {{ $port }}
  periodSeconds: 5
  failureThreshold: 60
livenessProbe:
  grpc:
    port: {{ $port }}
  periodSeconds: 10
  timeoutSeconds: 5
  failureThreshold: 3
readinessProbe:
  grpc:
    port: {{ $port }}
    service: lensemble.Readiness
  periodSeconds: 5
  timeoutSeconds: 5
  failureThreshold: 3
{{- end -}}

{{/* Config file and scratch mounts every container has. */}}
{{- define "lensemble.commonMounts" -}}
- name: config
  mountPath: /etc/lensemble/config.yaml
  subPath: config.yaml
  readOnly: true
- name: tmp
  mountPath: /tmp
{{- if .Values.config.network.tls.enabled }}
- name: tls
  mountPath: /etc/lensemble/tls
  readOnly: true
{{- end }}
{{- end -}}

{{/* Config and scratch volumes. Call with (dict "root" $ "configMap" "..."). */}}
{{- define "lensemble.commonVolumes" -}}
- name: config
  configMap:
    name: {{ .configMap }}
    defaultMode: 0444
- name: tmp
  emptyDir:
    sizeLimit: 1Gi
{{- end -}}

{{/* Grace period: the longest RPC plus time to checkpoint (seconds). */}}
{{- define "lensemble.gracePeriod" -}}
{{- add 30 (int (ceil .Values.config.network.rpc_timeout_s)) -}}
{{- end -}}

{{/*
Fail early on values the schema cannot express. The config's cross-field rules are
lensemble.configRules, generated into _rules.tpl from lensemble.config.rules (the registry
LensembleConfig checks too): edit the registry and run `python -m tools.regenerate`, never
_rules.tpl. The checks here are the chart's own, on chart knobs and install modes, which no
config rule has: trustDomain, a trust domain named 'coordinator' (it would share the
coordinator's object names), gangScheduling.queue when the gangScheduling knob picks kueue, and
tls.caBundleSecret (after the config rules, so those name their fields first).
*/}}
{{- define "lensemble.validate" -}}
{{- $all := include "lensemble.allTrustDomains" . | fromJsonArray -}}
{{- if and (eq .Values.mode "participant") (not (has .Values.trustDomain $all)) -}}
{{- fail (printf "trustDomain: '%s' is not the trust domain of any participant in config.federation.participants; use one of %s." .Values.trustDomain (join ", " $all)) -}}
{{- end -}}
{{- if has "coordinator" $all -}}
{{- fail "config.federation.participants: a trust domain named 'coordinator' collides with the coordinator's objects; rename it." -}}
{{- end -}}
{{- if and .Values.gangScheduling.scheduler (eq (include "lensemble.gangScheduler" .) "kueue") (not (include "lensemble.gangQueue" .)) -}}
{{- fail "gangScheduling.queue: kueue needs the LocalQueue name; set gangScheduling.queue." -}}
{{- end -}}
{{- include "lensemble.configRules" . -}}
{{- include "lensemble.validateCaBundle" . -}}
{{- end -}}

{{/* tls.caBundleSecret replaces every identity's ca.crt: refuse it where no process reads one. */}}
{{- define "lensemble.validateCaBundle" -}}
{{- if and .Values.tls.caBundleSecret (not .Values.config.network.tls.enabled) -}}
{{- fail "tls.caBundleSecret: it is set but config.network.tls.enabled is false, so no process reads a CA bundle; enable TLS or leave tls.caBundleSecret empty." -}}
{{- end -}}
{{- end -}}
