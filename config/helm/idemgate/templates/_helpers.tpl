{{/* The release's resources are named after it: "<release>-idemgate", or the release alone when it says idemgate already. */}}
{{- define "idemgate.fullname" -}}
{{- if contains "idemgate" .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-idemgate" .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "idemgate.selectorLabels" -}}
app.kubernetes.io/name: idemgate
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "idemgate.labels" -}}
{{ include "idemgate.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{- define "idemgate.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{- define "idemgate.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- .Values.serviceAccount.name | default (include "idemgate.fullname" .) -}}
{{- else -}}
{{- .Values.serviceAccount.name | default "default" -}}
{{- end -}}
{{- end -}}

{{- define "idemgate.sqlite" -}}
{{- if eq .Values.store.kind "sqlite" }}true{{ end -}}
{{- end -}}

{{/* Pods: 1 with SQLite; otherwise the value, 2 when unset. The schema refuses the rest. */}}
{{- define "idemgate.replicas" -}}
{{- if include "idemgate.sqlite" . -}}
1
{{- else -}}
{{- .Values.replicas | default 2 -}}
{{- end -}}
{{- end -}}

{{/*
The kubelet's grace: the preStop sleep, then idemgate's drain (shutdown_grace), then 5 s for
the exit itself. Computed when unset; a value below it is refused (the schema cannot compare
two values, so the template does).
*/}}
{{- define "idemgate.terminationGrace" -}}
{{- $need := add .Values.lifecycle.preStopSleepSeconds .Values.shutdownGraceSeconds 5 -}}
{{- $set := .Values.terminationGracePeriodSeconds -}}
{{- if and $set (lt (int $set) (int $need)) -}}
{{- fail (printf "terminationGracePeriodSeconds %d is below lifecycle.preStopSleepSeconds + shutdownGraceSeconds + 5 = %d: the kubelet would kill idemgate in the middle of its drain (leave it unset to have it computed)" (int $set) (int $need)) -}}
{{- end -}}
{{- $set | default $need -}}
{{- end -}}

{{/* The environment variables a Secret holds, by reference: the store URL, the admin token, secretEnv. */}}
{{- define "idemgate.secretEnv" -}}
{{- if not (include "idemgate.sqlite" .) }}
- name: IDEMGATE_STORE_URL
  valueFrom:
    secretKeyRef:
      name: {{ required "store.urlSecret.name: the existing Secret holding the store URL" .Values.store.urlSecret.name }}
      key: {{ .Values.store.urlSecret.key }}
{{- end }}
{{- if .Values.adminToken.secretName }}
- name: IDEMGATE_ADMIN_TOKEN
  valueFrom:
    secretKeyRef:
      name: {{ .Values.adminToken.secretName }}
      key: {{ .Values.adminToken.key }}
{{- end }}
{{- range .Values.secretEnv }}
- name: {{ .name }}
  valueFrom:
    secretKeyRef:
      name: {{ .secretName }}
      key: {{ .key }}
{{- end }}
{{- end -}}

{{- define "idemgate.securityContext" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
runAsNonRoot: true
runAsUser: 10001
runAsGroup: 10001
capabilities:
  drop: [ALL]
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{/* The pod, for the StatefulSet (SQLite) and the Deployment alike. */}}
{{- define "idemgate.podTemplate" -}}
metadata:
  labels:
    {{- include "idemgate.selectorLabels" . | nindent 4 }}
    {{- with .Values.podLabels }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  annotations:
    # a changed config rolls the pods
    checksum/config: {{ include (print $.Template.BasePath "/configmap.yaml") . | sha256sum }}
    {{- with .Values.podAnnotations }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
spec:
  serviceAccountName: {{ include "idemgate.serviceAccountName" . }}
  automountServiceAccountToken: false
  terminationGracePeriodSeconds: {{ include "idemgate.terminationGrace" . }}
  securityContext:
    runAsNonRoot: true
    runAsUser: 10001
    runAsGroup: 10001
    fsGroup: 10001
    fsGroupChangePolicy: OnRootMismatch
  {{- with .Values.imagePullSecrets }}
  imagePullSecrets:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with .Values.priorityClassName }}
  priorityClassName: {{ . }}
  {{- end }}
  {{- if include "idemgate.sqlite" . }}
  initContainers:
    # the one pod applies its migrations before it serves (the volume is its alone)
    - name: migrate
      image: {{ include "idemgate.image" . }}
      imagePullPolicy: {{ .Values.image.pullPolicy }}
      args: ["migrate", "--store", "sqlite:///data/idemgate.db"]
      securityContext:
        {{- include "idemgate.securityContext" . | nindent 8 }}
      volumeMounts:
        - {name: data, mountPath: /data}
        - {name: tmp, mountPath: /tmp}
      resources:
        {{- toYaml .Values.resources | nindent 8 }}
  {{- end }}
  containers:
    - name: idemgate
      image: {{ include "idemgate.image" . }}
      imagePullPolicy: {{ .Values.image.pullPolicy }}
      args: ["serve", "--config", "/etc/idemgate/config.yaml", "--no-migrate"]
      ports:
        - {name: proxy, containerPort: {{ .Values.ports.proxy }}, protocol: TCP}
        - {name: admin, containerPort: {{ .Values.ports.admin }}, protocol: TCP}
      {{- $secretEnv := include "idemgate.secretEnv" . | trim }}
      {{- if or $secretEnv .Values.env }}
      env:
        {{- with $secretEnv }}
        {{- . | nindent 8 }}
        {{- end }}
        {{- with .Values.env }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
      {{- end }}
      readinessProbe:
        httpGet: {path: /readyz, port: admin}
        {{- toYaml .Values.probes.readiness | nindent 8 }}
      startupProbe:
        httpGet: {path: /readyz, port: admin}
        {{- toYaml .Values.probes.startup | nindent 8 }}
      livenessProbe:
        httpGet: {path: /healthz, port: admin}
        {{- toYaml .Values.probes.liveness | nindent 8 }}
      lifecycle:
        preStop:
          {{- if .Values.lifecycle.nativeSleep }}
          sleep:
            seconds: {{ .Values.lifecycle.preStopSleepSeconds }}
          {{- else }}
          exec:
            command: ["sleep", "{{ .Values.lifecycle.preStopSleepSeconds }}"]
          {{- end }}
      securityContext:
        {{- include "idemgate.securityContext" . | nindent 8 }}
      resources:
        {{- toYaml .Values.resources | nindent 8 }}
      volumeMounts:
        - {name: config, mountPath: /etc/idemgate, readOnly: true}
        # the upgrade socket's folder (and the temp dir): the root file system is read-only
        - {name: tmp, mountPath: /tmp}
        {{- if include "idemgate.sqlite" . }}
        - {name: data, mountPath: /data}
        {{- end }}
  volumes:
    - name: config
      configMap:
        name: {{ include "idemgate.fullname" . }}
    - name: tmp
      emptyDir:
        sizeLimit: 64Mi
  {{- if not (include "idemgate.sqlite" .) }}
  {{- if .Values.topologySpread.enabled }}
  topologySpreadConstraints:
    - maxSkew: {{ .Values.topologySpread.maxSkew }}
      topologyKey: {{ .Values.topologySpread.topologyKey }}
      whenUnsatisfiable: {{ .Values.topologySpread.whenUnsatisfiable }}
      labelSelector:
        matchLabels:
          {{- include "idemgate.selectorLabels" . | nindent 10 }}
  {{- end }}
  {{- end }}
  {{- with .Values.nodeSelector }}
  nodeSelector:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with .Values.affinity }}
  affinity:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with .Values.tolerations }}
  tolerations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
{{- end -}}
