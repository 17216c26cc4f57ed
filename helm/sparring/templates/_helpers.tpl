{{/*
sparring.name: the chart name, or nameOverride.
*/}}
{{- define "sparring.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
sparring.fullname: the prefix of every resource name (release name, plus the chart name
unless the release name already contains it), truncated to 63 characters for DNS.
*/}}
{{- define "sparring.fullname" -}}
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

{{/*
sparring.chart: chart name and version, for the helm.sh/chart label.
*/}}
{{- define "sparring.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
sparring.labels: the common labels on every resource.
*/}}
{{- define "sparring.labels" -}}
helm.sh/chart: {{ include "sparring.chart" . }}
{{ include "sparring.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: sparring
{{- end }}

{{/*
sparring.selectorLabels: the labels a Service or Deployment selects on (add a component label).
*/}}
{{- define "sparring.selectorLabels" -}}
app.kubernetes.io/name: {{ include "sparring.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/*
sparring.serviceAccountName: the ServiceAccount every pod (and, by default, pipeline runs) uses.
*/}}
{{- define "sparring.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "sparring.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/*
sparring.kfpNamespace: where KFP runs execute: kfp.namespace, or the release namespace.
*/}}
{{- define "sparring.kfpNamespace" -}}
{{- default .Release.Namespace .Values.kfp.namespace }}
{{- end }}

{{/*
sparring.podMetadata: a pod template's labels and annotations. Call with (dict "ctx" $
"component" NAME "job" BOOL "annotations" DICT): selector labels and the component win over
podLabels, and jobPodLabels (no Istio sidecar by default) over podLabels for pods that must exit.
*/}}
{{- define "sparring.podMetadata" -}}
{{- $ctx := .ctx }}
{{- $labels := merge (fromYaml (include "sparring.selectorLabels" $ctx)) (dict "app.kubernetes.io/component" .component) }}
{{- if .job }}{{ $labels = merge $labels (deepCopy $ctx.Values.jobPodLabels) }}{{ end }}
{{- $labels = merge $labels (deepCopy $ctx.Values.podLabels) }}
{{- $annotations := merge (deepCopy (default (dict) .annotations)) (deepCopy $ctx.Values.podAnnotations) }}
labels:
  {{- toYaml $labels | nindent 2 }}
{{- with $annotations }}
annotations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/*
sparring.image: a runtime image reference. Call with (dict "ctx" $ "flavor" "cpu"|"gpu"):
<image.repository>:<image.tag or appVersion>-<flavor>, the same scheme images/build.sh tags.
*/}}
{{- define "sparring.image" -}}
{{- $tag := default .ctx.Chart.AppVersion .ctx.Values.image.tag }}
{{- printf "%s:%s-%s" .ctx.Values.image.repository $tag .flavor }}
{{- end }}

{{/*
sparring.servers: the chart's servers as a JSON list of {component, port}: MLflow (when
bundled) and the bundled S3 server. The NetworkPolicies and Istio policies cover each.
*/}}
{{- define "sparring.servers" -}}
{{- $servers := list }}
{{- if .Values.mlflow.enabled }}{{ $servers = append $servers (dict "component" "mlflow" "port" (int .Values.mlflow.service.port)) }}{{ end }}
{{- if .Values.seaweedfs.enabled }}{{ $servers = append $servers (dict "component" "s3" "port" 8333) }}{{ end }}
{{- toJson $servers }}
{{- end }}

{{/*
sparring.s3SecretName: the Secret holding S3 keys (chart-made or existing); empty for
serviceAccount mode (IRSA / workload identity).
*/}}
{{- define "sparring.s3SecretName" -}}
{{- $c := .Values.s3.credentials }}
{{- if eq $c.mode "secret" }}
{{- printf "%s-s3" (include "sparring.fullname" .) }}
{{- else if eq $c.mode "existingSecret" }}
{{- $c.existingSecret }}
{{- end }}
{{- end }}

{{/*
sparring.s3Endpoint: the S3 endpoint URL clients use: the bundled SeaweedFS Service when it is
enabled, else s3.endpoint (empty = AWS).
*/}}
{{- define "sparring.s3Endpoint" -}}
{{- if .Values.seaweedfs.enabled }}
{{- printf "http://%s-s3.%s.svc.cluster.local:8333" (include "sparring.fullname" .) .Release.Namespace }}
{{- else }}
{{- .Values.s3.endpoint }}
{{- end }}
{{- end }}

{{/*
sparring.s3PathStyle: "true" when path-style addressing is needed (bundled SeaweedFS always).
*/}}
{{- define "sparring.s3PathStyle" -}}
{{- if or .Values.seaweedfs.enabled .Values.s3.forcePathStyle }}true{{ else }}false{{ end }}
{{- end }}

{{/*
sparring.s3Uri: s3://<bucket>/<prefix>[/<sub>]. Call with (dict "ctx" $ "sub" "kfp").
*/}}
{{- define "sparring.s3Uri" -}}
{{- $base := printf "s3://%s" .ctx.Values.s3.bucket }}
{{- with trimAll "/" .ctx.Values.s3.prefix }}{{ $base = printf "%s/%s" $base . }}{{ end }}
{{- with .sub }}{{ $base = printf "%s/%s" $base . }}{{ end }}
{{- $base }}
{{- end }}

{{/*
sparring.mlflowUrl: the in-cluster MLflow URL (or mlflow.externalUrl when not bundled).
*/}}
{{- define "sparring.mlflowUrl" -}}
{{- if .Values.mlflow.enabled }}
{{- printf "http://%s-mlflow.%s.svc.cluster.local:%d%s" (include "sparring.fullname" .) .Release.Namespace (int .Values.mlflow.service.port) .Values.mlflow.staticPrefix }}
{{- else }}
{{- .Values.mlflow.externalUrl }}
{{- end }}
{{- end }}

{{/*
sparring.mlflowAuthSecretName: the Secret with the MLflow login (chart-made or existing); empty
when MLflow needs none. With `mlflow.enabled: false` it is the login to the external server.
*/}}
{{- define "sparring.mlflowAuthSecretName" -}}
{{- if .Values.mlflow.auth.enabled }}
{{- .Values.mlflow.auth.existingSecret | default (printf "%s-mlflow-auth" (include "sparring.fullname" .)) }}
{{- end }}
{{- end }}

{{/*
sparring.mlflowRunnerSecretName: the Secret with the pipeline runner's MLflow login (a non-admin
user the runner Job creates; chart-made or existing); empty unless the bundled MLflow has auth.
*/}}
{{- define "sparring.mlflowRunnerSecretName" -}}
{{- if and .Values.mlflow.enabled .Values.mlflow.auth.enabled }}
{{- .Values.mlflow.auth.runner.existingSecret | default (printf "%s-mlflow-runner" (include "sparring.fullname" .)) }}
{{- end }}
{{- end }}

{{/*
sparring.mlflowTaskSecretName: the MLflow login pipeline tasks get (`kubernetes.mlflow_secret`):
the runner's with the bundled MLflow, the auth Secret's with an external one; empty without auth.
The bundled server's admin login never reaches a task.
*/}}
{{- define "sparring.mlflowTaskSecretName" -}}
{{- if .Values.mlflow.enabled }}
{{- include "sparring.mlflowRunnerSecretName" . }}
{{- else }}
{{- include "sparring.mlflowAuthSecretName" . }}
{{- end }}
{{- end }}

{{/*
sparring.mlflowWorkers: server workers: mlflow.workers, else 1 on sqlite and 2 on postgres.
*/}}
{{- define "sparring.mlflowWorkers" -}}
{{- if kindIs "invalid" .Values.mlflow.workers }}
{{- if eq .Values.mlflow.backendStore.type "sqlite" }}1{{ else }}2{{ end }}
{{- else }}
{{- .Values.mlflow.workers }}
{{- end }}
{{- end }}

{{/*
sparring.kfpMinVersion: the oldest KFP backend this install works with: kfp.minVersion, else
2.17.0 when the launcher needs it (a non-AWS S3 endpoint, or IRSA), else 2.14.0 (the exit
handler's final status).
*/}}
{{- define "sparring.kfpMinVersion" -}}
{{- if .Values.kfp.minVersion }}
{{- .Values.kfp.minVersion }}
{{- else if or (include "sparring.s3Endpoint" .) (eq .Values.s3.credentials.mode "serviceAccount") }}
{{- "2.17.0" }}
{{- else }}
{{- "2.14.0" }}
{{- end }}
{{- end }}

{{/*
sparring.hfSecretName: the Secret holding HF_TOKEN (chart-made or existing); empty when none.
*/}}
{{- define "sparring.hfSecretName" -}}
{{- if .Values.hf.existingSecret }}
{{- .Values.hf.existingSecret }}
{{- else if .Values.hf.token }}
{{- printf "%s-hf" (include "sparring.fullname" .) }}
{{- end }}
{{- end }}

{{/*
sparring.launcherData: the `data` of a kfp-launcher ConfigMap that sends KFP artifacts to
s3://<bucket>/<prefix>/kfp with this release's S3 settings (the ConfigMap template and the
`kubectl patch` in NOTES.txt both use it).
*/}}
{{- define "sparring.launcherData" -}}
{{- $s3 := dict "region" .Values.s3.region "forcePathStyle" (eq (include "sparring.s3PathStyle" .) "true") }}
{{- with include "sparring.s3Endpoint" . }}
{{- $_ := set $s3 "endpoint" (. | trimPrefix "https://" | trimPrefix "http://") }}
{{- $_ := set $s3 "disableSSL" (hasPrefix "http://" .) }}
{{- end }}
{{- with include "sparring.s3SecretName" . }}
{{- $_ := set $s3 "credentials" (dict "fromEnv" false "secretRef" (dict "secretName" . "accessKeyKey" $.Values.s3.credentials.accessKeyIdKey "secretKeyKey" $.Values.s3.credentials.secretAccessKeyKey)) }}
{{- else }}
{{- $_ := set $s3 "credentials" (dict "fromEnv" true) }}
{{- end }}
defaultPipelineRoot: {{ include "sparring.s3Uri" (dict "ctx" . "sub" "kfp") | quote }}
providers: {{ toYaml (dict "s3" (dict "default" $s3)) | quote }}
{{- end }}

{{/*
sparring.launcherPreflight: with kfp.launcher.create, fail when a kfp-launcher ConfigMap exists
that this release does not own (KFP's own, or one the profile controller reconciles): Helm could
not import it, and after --take-ownership `helm uninstall` would delete KFP's ConfigMap. Call
with (dict "ctx" $ "existing" (lookup ...)); offline renders see an empty lookup.
*/}}
{{- define "sparring.launcherPreflight" -}}
{{- $ctx := .ctx }}
{{- if and $ctx.Values.kfp.launcher.create .existing }}
{{- $annotations := default (dict) .existing.metadata.annotations }}
{{- $owner := get $annotations "meta.helm.sh/release-name" }}
{{- $ownerNs := get $annotations "meta.helm.sh/release-namespace" }}
{{- if not (and (eq $owner $ctx.Release.Name) (eq $ownerNs $ctx.Release.Namespace)) }}
{{- fail (printf "kfp.launcher.create=true, but ConfigMap kfp-launcher already exists in namespace %s (owned by %s): KFP ships it, and multi-user KFP's profile controller reconciles one per profile. Keep kfp.launcher.create=false and point the existing one at S3 instead: the kubectl patch command is in docs/cluster.md and in this chart's NOTES.txt (helm install --set kfp.launcher.create=false)" (include "sparring.kfpNamespace" $ctx) (default "no Helm release" $owner)) }}
{{- end }}
{{- end }}
{{- end }}

{{/*
sparring.s3Env: container env for boto3/MLflow: region, endpoint, addressing style and, unless
credentials come from the ServiceAccount, the keys from the S3 Secret.
*/}}
{{- define "sparring.s3Env" -}}
- name: AWS_DEFAULT_REGION
  value: {{ .Values.s3.region | quote }}
{{- with include "sparring.s3Endpoint" . }}
- name: AWS_ENDPOINT_URL_S3
  value: {{ . | quote }}
- name: MLFLOW_S3_ENDPOINT_URL
  value: {{ . | quote }}
{{- end }}
{{- with include "sparring.s3SecretName" . }}
- name: AWS_ACCESS_KEY_ID
  valueFrom:
    secretKeyRef:
      name: {{ . }}
      key: {{ $.Values.s3.credentials.accessKeyIdKey }}
- name: AWS_SECRET_ACCESS_KEY
  valueFrom:
    secretKeyRef:
      name: {{ . }}
      key: {{ $.Values.s3.credentials.secretAccessKeyKey }}
{{- end }}
{{- end }}

{{/*
sparring.podSpecCommon: serviceAccount, pull secrets and pod securityContext shared by all pods.
*/}}
{{- define "sparring.podSpecCommon" -}}
serviceAccountName: {{ include "sparring.serviceAccountName" . }}
automountServiceAccountToken: false
{{- with .Values.image.pullSecrets }}
imagePullSecrets:
{{- range . }}
  - name: {{ . }}
{{- end }}
{{- end }}
securityContext:
  {{- toYaml .Values.podSecurityContext | nindent 2 }}
{{- end }}

{{/*
sparring.validate: fail on value combinations the schema cannot express, naming the fix.
*/}}
{{- define "sparring.validate" -}}
{{- $c := .Values.s3.credentials }}
{{- if not .Values.s3.bucket }}
{{- fail "s3.bucket is required: the bucket for KFP artifacts, checkpoints and MLflow artifacts (--set s3.bucket=my-bucket)" }}
{{- end }}
{{- if and (eq $c.mode "secret") (or (not $c.accessKeyId) (not $c.secretAccessKey)) }}
{{- fail "s3.credentials.mode=secret needs s3.credentials.accessKeyId and s3.credentials.secretAccessKey; or use mode=existingSecret with s3.credentials.existingSecret, or mode=serviceAccount with an IRSA/workload-identity annotation" }}
{{- end }}
{{- if and (eq $c.mode "existingSecret") (not $c.existingSecret) }}
{{- fail "s3.credentials.mode=existingSecret needs s3.credentials.existingSecret (the name of a Secret holding the keys)" }}
{{- end }}
{{- if and (eq $c.mode "serviceAccount") (not .Values.serviceAccount.annotations) }}
{{- fail "s3.credentials.mode=serviceAccount needs serviceAccount.annotations, e.g. eks.amazonaws.com/role-arn (IRSA) or iam.gke.io/gcp-service-account (workload identity)" }}
{{- end }}
{{- if and .Values.seaweedfs.enabled (ne $c.mode "secret") }}
{{- fail "seaweedfs.enabled needs s3.credentials.mode=secret: the bundled S3 server is configured from those keys" }}
{{- end }}
{{- if and .Values.seaweedfs.enabled .Values.s3.endpoint }}
{{- fail "seaweedfs.enabled and s3.endpoint are exclusive: the bundled server is the endpoint; unset s3.endpoint" }}
{{- end }}
{{- if .Values.mlflow.enabled }}
{{- if and (eq .Values.mlflow.backendStore.type "sqlite") (gt (int .Values.mlflow.replicas) 1) }}
{{- fail "mlflow.backendStore.type=sqlite supports one replica (a file on a ReadWriteOnce PVC); set mlflow.replicas=1 or use type=postgres" }}
{{- end }}
{{- if and (eq .Values.mlflow.backendStore.type "postgres") (not .Values.mlflow.backendStore.postgres.existingSecret) }}
{{- fail "mlflow.backendStore.type=postgres needs mlflow.backendStore.postgres.existingSecret: a Secret whose key (existingSecretKey) holds postgresql://user:password@host:5432/db" }}
{{- end }}
{{- else if not .Values.mlflow.externalUrl }}
{{- fail "mlflow.enabled=false needs mlflow.externalUrl (the tracking server pipeline runs log to)" }}
{{- end }}
{{- range $key := list "name" "registered_model" "storage" "tracking" "kubernetes" }}
{{- if hasKey $.Values.pipeline.config $key }}
{{- fail (printf "pipeline.config.%s is set by the chart (from s3.*, mlflow.*, image.*, pipeline.gpu/name/experiment/registeredModel); remove it from pipeline.config" $key) }}
{{- end }}
{{- end }}
{{- if and (ne $c.mode "serviceAccount") (or (ne $c.accessKeyIdKey "AWS_ACCESS_KEY_ID") (ne $c.secretAccessKeyKey "AWS_SECRET_ACCESS_KEY")) }}
{{- fail "pipeline tasks read the S3 Secret's keys AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (use_secret_as_env); keep s3.credentials.accessKeyIdKey/secretAccessKeyKey at those names" }}
{{- end }}
{{- if ne (include "sparring.kfpNamespace" .) .Release.Namespace }}
{{- fail (printf "kfp.namespace=%s must be the release namespace (%s): pipeline tasks read the S3 Secret and kfp-launcher from their own namespace; install the release there (helm install -n %s)" .Values.kfp.namespace .Release.Namespace .Values.kfp.namespace) }}
{{- end }}
{{- if and (eq .Values.mlflow.backendStore.type "sqlite") (gt (int (include "sparring.mlflowWorkers" .)) 1) }}
{{- fail "mlflow.backendStore.type=sqlite takes one MLflow worker (sqlite has one writer at a time); leave mlflow.workers empty or set 1, or use type=postgres" }}
{{- end }}
{{- if and .Values.hf.token .Values.hf.existingSecret }}
{{- fail "hf.token and hf.existingSecret are exclusive: the chart makes a Secret from hf.token, or uses the one named by hf.existingSecret" }}
{{- end }}
{{- if and .Values.mlflow.ingress.enabled .Values.mlflow.httpRoute.enabled }}
{{- fail "mlflow.ingress.enabled and mlflow.httpRoute.enabled are exclusive: expose MLflow one way" }}
{{- end }}
{{- if and .Values.mlflow.httpRoute.enabled (not .Values.mlflow.httpRoute.parentRefs) }}
{{- fail "mlflow.httpRoute.enabled needs mlflow.httpRoute.parentRefs (the Gateway to attach to, e.g. [{name: main, namespace: gateway}])" }}
{{- end }}
{{- with .Values.mlflow.auth }}
{{- if .enabled }}
{{- if and $.Values.mlflow.enabled (ne $.Values.mlflow.backendStore.type "sqlite") }}
{{- fail "mlflow.auth.enabled keeps MLflow's users in a sqlite file on the MLflow volume: it needs mlflow.backendStore.type=sqlite (with postgres, run the basic-auth app from mlflow.extraArgs with your own MLFLOW_AUTH_CONFIG_PATH)" }}
{{- end }}
{{- if and (not .existingSecret) (lt (len .adminPassword) 12) }}
{{- fail "mlflow.auth.enabled needs mlflow.auth.adminPassword (at least 12 characters, MLflow's rule) or mlflow.auth.existingSecret (keys MLFLOW_TRACKING_USERNAME, MLFLOW_TRACKING_PASSWORD, MLFLOW_FLASK_SERVER_SECRET_KEY)" }}
{{- end }}
{{- if $.Values.mlflow.enabled }}
{{- if and .runner.password (lt (len .runner.password) 12) }}
{{- fail "mlflow.auth.runner.password needs at least 12 characters (MLflow's rule); leave it empty to have the chart generate one" }}
{{- end }}
{{- if and .runner.password .runner.existingSecret }}
{{- fail "mlflow.auth.runner.password and mlflow.auth.runner.existingSecret are exclusive: the chart makes the runner's Secret from the password, or uses the one named by existingSecret" }}
{{- end }}
{{- if and (not .existingSecret) (not .runner.existingSecret) (eq .runner.username .adminUsername) }}
{{- fail "mlflow.auth.runner.username must differ from mlflow.auth.adminUsername: pipeline tasks log in as the runner, which must not be the MLflow admin" }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}
{{- if and .Values.istio.enabled (not .Values.networkPolicy.enabled) }}
{{- fail "istio.enabled admits the MLflow and S3 ports from any caller (run pods have no mTLS identity) and relies on the NetworkPolicies to keep the callers to pipeline pods: set networkPolicy.enabled=true" }}
{{- end }}
{{- if and .Values.pipeline.register.recurringRun.enabled (not .Values.pipeline.register.enabled) }}
{{- fail "pipeline.register.recurringRun.enabled needs pipeline.register.enabled (the Job that creates it)" }}
{{- end }}
{{- end }}

{{/*
sparring.pipelineConfig: the PipelineConfig (sparring/pipeline_config.py) that
`sparring compile --config` reads, as YAML: pipeline.config passed through, plus the storage,
tracking, images and GPU placement this chart owns.
*/}}
{{- define "sparring.pipelineConfig" -}}
{{- $p := .Values.pipeline }}
{{- $game := get $p.config "game" }}
{{- if kindIs "map" $game }}{{ $game = get $game "name" }}{{ end }}
{{- $suffix := ternary "-diplomacy" "" (eq (toString $game) "diplomacy") }}
{{- $k8s := dict
  "image" (include "sparring.image" (dict "ctx" . "flavor" (printf "cpu%s" $suffix)))
  "gpu_image" (include "sparring.image" (dict "ctx" . "flavor" (printf "gpu%s" $suffix)))
  "accelerator_type" $p.gpu.accelerator
  "rollout_gpus" (int $p.gpu.rollout)
  "train_gpus" (int $p.gpu.train)
  "eval_gpus" (int $p.gpu.eval)
  "node_selector" $p.gpu.nodeSelector
  "tolerations" $p.gpu.tolerations
  "s3_secret" (include "sparring.s3SecretName" . | default nil)
  "shm_size" ($p.gpu.shmSize | default nil)
  "retries" (int $p.retries)
  "caching" $p.caching
  "run_as_user" $p.runAsUser
  "run_as_group" $p.runAsGroup }}
{{- with include "sparring.hfSecretName" . }}{{ $_ := set $k8s "hf_secret" . }}{{ end }}
{{- with include "sparring.mlflowTaskSecretName" . }}{{ $_ := set $k8s "mlflow_secret" . }}{{ end }}
{{- if .Values.modelCache.enabled }}{{ $_ := set $k8s "model_cache_pvc" (printf "%s-model-cache" (include "sparring.fullname" .)) }}{{ end }}
{{- with .Values.image.pullSecrets }}{{ $_ := set $k8s "image_pull_secrets" . }}{{ end }}
{{- $storage := dict
  "root" (include "sparring.s3Uri" (dict "ctx" . "sub" "runs"))
  "endpoint_url" (include "sparring.s3Endpoint" . | default nil)
  "region" .Values.s3.region }}
{{- $tracking := dict "tracking_uri" (include "sparring.mlflowUrl" .) "experiment" $p.experiment }}
{{- if .Values.mlflow.enabled }}{{/* its --artifacts-destination: checkpoints register behind the proxy */}}
{{- $_ := set $tracking "artifacts_destination" (include "sparring.s3Uri" (dict "ctx" . "sub" "mlflow")) }}
{{- end }}
{{- $owned := dict "name" $p.name "registered_model" $p.registeredModel "storage" $storage "tracking" $tracking "kubernetes" $k8s }}
{{- toYaml (merge (deepCopy $owned) (deepCopy $p.config)) }}
{{- end }}
