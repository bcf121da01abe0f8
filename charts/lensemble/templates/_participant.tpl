{{/*
The participant pod template, shared by a trust domain's StatefulSet (pod ordinal = participant)
and by a participant's own StatefulSet (rankGroups: pod ordinal = node rank).
Call with (dict "root" $ "td" TD "ids" IDS "group" GROUP-or-nil "pid" PARTICIPANT-or-"").
*/}}
{{- define "lensemble.participantPod" -}}
{{- $ := .root -}}
{{- $td := .td -}}
{{- $group := .group -}}
{{- $net := $.Values.config.network -}}
{{- $dep := $.Values.config.deployment -}}
{{- $tdName := include "lensemble.participantName" (dict "root" $ "td" $td) -}}
{{- $placement := get $dep.trust_domains $td | default dict -}}
{{- $scheduler := include "lensemble.gangScheduler" $ -}}
{{- $queue := include "lensemble.gangQueue" $ -}}
{{- $gpus := int $dep.resources.participant.gpu -}}
{{- $nodes := 1 -}}
{{- $rendezvous := false -}}
{{- if $group -}}
{{- $gpus = int $group.gpus -}}
{{- $nodes = int $group.nodes -}}
{{- $rendezvous = gt $nodes 1 -}}
{{- end -}}
{{- /* A pod group (several nodes) is admitted whole; a single pod with several GPUs alone. */ -}}
{{- $podGroup := and $rendezvous (ne $scheduler "none") -}}
{{- $single := and (not $rendezvous) (gt $gpus 1) (ne $scheduler "none") -}}
metadata:
  labels:
    {{- include "lensemble.labels" (dict "root" $ "component" "participant" "td" $td) | nindent 4 }}
    {{- if $group }}
    lensemble.dev/participant: {{ .pid }}
    {{- end }}
    {{- if and (or $single $podGroup) (eq $scheduler "kueue") }}
    # Kueue admits this participant's pods as one workload, and never another's with them.
    kueue.x-k8s.io/queue-name: {{ $queue }}
    {{- end }}
    {{- if and $podGroup (eq $scheduler "kueue") }}
    kueue.x-k8s.io/pod-group-name: {{ $group.name }}
    {{- end }}
  annotations:
    checksum/config: {{ toYaml $.Values.config | sha256sum }}
    lensemble.dev/participants: {{ join "," .ids | quote }}
    {{- if and $podGroup (eq $scheduler "kueue") }}
    kueue.x-k8s.io/pod-group-total-count: {{ $nodes | quote }}
    {{- end }}
    {{- if and (or $single $podGroup) (eq $scheduler "volcano") }}
    scheduling.volcano.sh/queue-name: {{ $queue | default "default" }}
    {{- end }}
    {{- if and $podGroup (eq $scheduler "volcano") }}
    scheduling.k8s.io/group-name: {{ $group.name }}
    {{- end }}
    {{- with $.Values.participant.podAnnotations }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
spec:
  serviceAccountName: {{ $tdName }}
  automountServiceAccountToken: false
  enableServiceLinks: false
  terminationGracePeriodSeconds: {{ include "lensemble.gracePeriod" $ }}
  {{- if and (or $single $podGroup) (eq $scheduler "volcano") }}
  schedulerName: volcano
  {{- end }}
  securityContext:
    {{- include "lensemble.podSecurityContext" $ | nindent 4 }}
  {{- with $placement.node_selector }}
  nodeSelector:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with $placement.tolerations }}
  tolerations:
    {{- range . }}
    - key: {{ .key }}
      operator: {{ .operator }}
      {{- if .value }}
      value: {{ .value | quote }}
      {{- end }}
      {{- if .effect }}
      effect: {{ .effect }}
      {{- end }}
    {{- end }}
  {{- end }}
  {{- if or $.Values.trustDomainIsolation $rendezvous }}
  affinity:
    podAntiAffinity:
      requiredDuringSchedulingIgnoredDuringExecution:
        {{- if $rendezvous }}
        # One node per node rank: the pods of this participant never share a node.
        - labelSelector:
            matchLabels:
              lensemble.dev/run: {{ include "lensemble.run" $ }}
              lensemble.dev/participant: {{ .pid }}
          topologyKey: kubernetes.io/hostname
        {{- end }}
        {{- if $.Values.trustDomainIsolation }}
        # No node ever runs pods (so mounts volumes) of two trust domains, nor the coordinator.
        - labelSelector:
            matchExpressions:
              - key: lensemble.dev/trust-domain
                operator: Exists
              - key: lensemble.dev/trust-domain
                operator: NotIn
                values:
                  - {{ $td }}
          namespaceSelector: {}
          topologyKey: kubernetes.io/hostname
        - labelSelector:
            matchLabels:
              app.kubernetes.io/component: coordinator
              app.kubernetes.io/name: lensemble
          namespaceSelector: {}
          topologyKey: kubernetes.io/hostname
        {{- end }}
  {{- end }}
  {{- with $.Values.image.pullSecrets }}
  imagePullSecrets:
    {{- range . }}
    - name: {{ . }}
    {{- end }}
  {{- end }}
  containers:
    - name: participant
      image: {{ include "lensemble.image" $ }}
      imagePullPolicy: {{ include "lensemble.pullPolicy" $ }}
      command: ["lensemble"]
      args: ["serve"]
      env:
        {{- include "lensemble.env" (dict "root" $ "role" "participant") | nindent 8 }}
        - name: LENSEMBLE_TRUST_DOMAIN
          value: {{ $td }}
        {{- if $group }}
        # Its own StatefulSet: the pod ordinal is the node rank, not a participant.
        - name: LENSEMBLE_PARTICIPANT_ID
          value: {{ .pid }}
        - name: LENSEMBLE_NODE_RANK
          valueFrom:
            fieldRef:
              fieldPath: metadata.labels['apps.kubernetes.io/pod-index']
        {{- if $rendezvous }}
        - name: LENSEMBLE_RENDEZVOUS_HOST
          value: {{ $group.rendezvousHost }}
        {{- end }}
        {{- else }}
        - name: LENSEMBLE_POD_NAME
          valueFrom:
            fieldRef:
              fieldPath: metadata.name
        {{- end }}
      ports:
        {{- include "lensemble.ports" (dict "root" $ "role" "participant") | nindent 8 }}
        {{- if $rendezvous }}
        - name: rendezvous
          containerPort: {{ int $group.rendezvousPort }}
          protocol: TCP
        {{- end }}
      {{- include "lensemble.probes" $ | nindent 6 }}
      resources:
        {{- if and $group (not (or $.Values.resources.participant.requests $.Values.resources.participant.limits)) }}
        requests:
          cpu: {{ $group.cpu | quote }}
          memory: {{ $group.memory | quote }}
          {{- if gt $gpus 0 }}
          nvidia.com/gpu: {{ $gpus }}
          {{- end }}
        limits:
          memory: {{ $group.memory | quote }}
          {{- if gt $gpus 0 }}
          nvidia.com/gpu: {{ $gpus }}
          {{- end }}
        {{- else }}
        {{- include "lensemble.resources" (dict "root" $ "role" "participant") | nindent 8 }}
        {{- end }}
      securityContext:
        {{- include "lensemble.containerSecurityContext" $ | nindent 8 }}
      volumeMounts:
        {{- include "lensemble.commonMounts" $ | nindent 8 }}
        - name: data
          mountPath: {{ $.Values.config.run.output_dir }}
        {{- if and $group (gt (int $group.processesPerNode) 1) }}
        - name: shm
          mountPath: /dev/shm
        {{- end }}
  volumes:
    {{- include "lensemble.commonVolumes" (dict "root" $ "configMap" (printf "%s-config" $tdName)) | nindent 4 }}
    {{- if $net.tls.enabled }}
    {{- include "lensemble.tlsVolume" (dict "root" $ "identities" .ids) | nindent 4 }}
    {{- end }}
    {{- if and $group (gt (int $group.processesPerNode) 1) }}
    # torch.distributed moves tensors between local ranks through /dev/shm (64 MiB by default).
    - name: shm
      emptyDir:
        medium: Memory
        sizeLimit: {{ printf "%dMi" (int $group.shmMib) }}
    {{- end }}
{{- end -}}

{{/* The participant data volume of every participant pod. Call with (dict "root" $ "td" TD). */}}
{{- define "lensemble.participantClaim" -}}
- apiVersion: v1
  kind: PersistentVolumeClaim
  metadata:
    name: data
    labels:
      {{- include "lensemble.selectorLabels" (dict "root" .root "component" "participant" "td" .td) | nindent 6 }}
  spec:
    accessModes:
      - ReadWriteOnce
    {{- with (.root.Values.persistence.participant.storageClass | default .root.Values.config.deployment.storage.class_name) }}
    storageClassName: {{ . }}
    {{- end }}
    resources:
      requests:
        storage: {{ .root.Values.persistence.participant.size | default .root.Values.config.deployment.storage.size }}
{{- end -}}

{{/* The effective gang scheduler: the gangScheduling knob, else the config's. */}}
{{- define "lensemble.gangScheduler" -}}
{{- .Values.gangScheduling.scheduler | default .Values.config.deployment.gang_scheduling.scheduler | default "none" -}}
{{- end -}}

{{- define "lensemble.gangQueue" -}}
{{- .Values.gangScheduling.queue | default .Values.config.deployment.gang_scheduling.queue -}}
{{- end -}}
