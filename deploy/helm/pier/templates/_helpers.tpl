{{/*
Labels on every object's metadata. app.kubernetes.io/part-of: pier is what
deploy/base's kustomization adds to every object; the others are Helm's
usual ones. Pod templates and selectors get none of these: a selector cannot
change, and the same pod labels as deploy/ keep the ServiceMonitors, the
PodMonitors and the PodDisruptionBudget matching either way.
*/}}
{{- define "pier.labels" -}}
app.kubernetes.io/part-of: pier
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
An image reference from a values entry (repository, tag, digest): pinned by
its digest when one is given, else repository:tag, the tag defaulting to the
chart's appVersion. Called as (list $ .Values.agent.image).
*/}}
{{- define "pier.image" -}}
{{- $root := index . 0 -}}
{{- $image := index . 1 -}}
{{- if $image.digest -}}
{{- if not (hasPrefix "sha256:" $image.digest) -}}
{{- fail (printf "image digest %q: expected sha256:<hex>" $image.digest) -}}
{{- end -}}
{{- printf "%s@%s" $image.repository $image.digest -}}
{{- else -}}
{{- printf "%s:%s" $image.repository (toString ($image.tag | default $root.Chart.AppVersion)) -}}
{{- end -}}
{{- end }}
