#!/usr/bin/env bash
# Build (and optionally push) the Sparring runtime images with ONE tag, the project's version.
# The version is read from sparring/__init__.py (`__version__`), the same value the Helm chart's
# appVersion and the pipeline config use, so every image reference is
#   <repository>:<version>-cpu   <repository>:<version>-gpu                 (Apache-2.0)
#   <repository>:<version>-cpu-diplomacy   <repository>:<version>-gpu-diplomacy
#   <repository>:<version>-mlflow   the chart's MLflow server: no training stack (Dockerfile.mlflow)
# The `-diplomacy` flavours add the Diplomacy engine, which is AGPL-3.0: they are the
# `diplomacy` target of the same Dockerfile, labelled "Apache-2.0 AND AGPL-3.0-only".
# Each image installs its lock file, images/requirements-<flavor>.lock (images/lock.py).
# Each image pre-bakes the named real models in the build arg PREBAKE_MODELS (--prebake,
# --no-prebake; default: the Dockerfiles' smollm2-135m-instruct).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
REPOSITORY="${SPARRING_IMAGE_REPOSITORY:-ghcr.io/sparring/sparring}"
DOCKER="${DOCKER:-docker}"
PUSH=0
DRY_RUN=0
FLAVORS=(cpu gpu cpu-diplomacy gpu-diplomacy mlflow)
PLATFORM=""
PREBAKE_SET=0  # 1: pass PREBAKE_MODELS="$PREBAKE" (else the Dockerfiles' default)
PREBAKE=""

usage() {
  cat <<USAGE
Usage: images/build.sh [options]

Build the Sparring runtime images, tagged with the project version from sparring/__init__.py:
  <repository>:<version>-cpu             (images/Dockerfile.cpu, target runtime)
  <repository>:<version>-gpu             (images/Dockerfile.gpu, target runtime)
  <repository>:<version>-cpu-diplomacy   (images/Dockerfile.cpu, target diplomacy; AGPL-3.0)
  <repository>:<version>-gpu-diplomacy   (images/Dockerfile.gpu, target diplomacy; AGPL-3.0)
  <repository>:<version>-mlflow          (images/Dockerfile.mlflow: the chart's MLflow server)

Options:
  --repository REPO   image repository (default: \$SPARRING_IMAGE_REPOSITORY or
                      ghcr.io/sparring/sparring; the Helm value image.repository must match)
  --only FLAVOR       build one flavor only: cpu, gpu, cpu-diplomacy, gpu-diplomacy or mlflow
  --platform P        passed to docker build (e.g. linux/amd64)
  --prebake "NAMES"   named real models to fetch into the images at build time, space-separated
                      (build arg PREBAKE_MODELS; default: the Dockerfiles' smollm2-135m-instruct)
  --no-prebake        pre-bake no model (the same as --prebake "")
  --push              push the images after building
  --print             print the image references and exit
  --dry-run           print the docker commands instead of running them
  -h, --help          show this help

Environment: DOCKER (default: docker; podman works too).
USAGE
}

version() {
  sed -n 's/^__version__ = "\(.*\)"$/\1/p' "$ROOT/sparring/__init__.py"
}

PRINT=0
while [[ $# -gt 0 ]]; do
  case "$1" in
    --repository) REPOSITORY="${2:?--repository needs a value}"; shift 2 ;;
    --only)
      case "${2:-}" in
        cpu|gpu|cpu-diplomacy|gpu-diplomacy|mlflow) FLAVORS=("$2") ;;
        *) echo "error: --only takes cpu, gpu, cpu-diplomacy, gpu-diplomacy or mlflow, got '${2:-}'" >&2; exit 2 ;;
      esac
      shift 2 ;;
    --platform) PLATFORM="${2:?--platform needs a value}"; shift 2 ;;
    --prebake)
      if [[ $# -lt 2 ]]; then echo "error: --prebake needs a value (\"\" for none)" >&2; exit 2; fi
      PREBAKE_SET=1; PREBAKE="$2"; shift 2 ;;
    --no-prebake) PREBAKE_SET=1; PREBAKE=""; shift ;;
    --push) PUSH=1; shift ;;
    --print) PRINT=1; shift ;;
    --dry-run) DRY_RUN=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "error: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
done

VERSION="$(version)"
if [[ -z "$VERSION" ]]; then
  echo "error: no __version__ = \"...\" line in $ROOT/sparring/__init__.py" >&2
  exit 1
fi

run() {
  if [[ $DRY_RUN -eq 1 ]]; then
    printf '%q ' "$@"; echo
  else
    "$@"
  fi
}

for flavor in "${FLAVORS[@]}"; do
  ref="$REPOSITORY:$VERSION-$flavor"
  if [[ $PRINT -eq 1 ]]; then echo "$ref"; continue; fi
  target=runtime
  if [[ $flavor == *-diplomacy ]]; then target=diplomacy; fi
  args=(build -f "$ROOT/images/Dockerfile.${flavor%-diplomacy}" --target "$target" -t "$ref"
        --build-arg "SPARRING_VERSION=$VERSION")
  if [[ -n "$PLATFORM" ]]; then args+=(--platform "$PLATFORM"); fi
  # the MLflow server image holds no model
  if [[ $PREBAKE_SET -eq 1 && $flavor != mlflow ]]; then args+=(--build-arg "PREBAKE_MODELS=$PREBAKE"); fi
  run "$DOCKER" "${args[@]}" "$ROOT"
  if [[ $PUSH -eq 1 ]]; then run "$DOCKER" push "$ref"; fi
done
