#!/usr/bin/env bash
# Build (and optionally push) the Sparring CPU and GPU runtime images with ONE tag, the
# project's version. The version is read from sparring/__init__.py (`__version__`), the same
# value the Helm chart's appVersion and the pipeline config use, so every image reference is
#   <repository>:<version>-cpu   and   <repository>:<version>-gpu
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
REPOSITORY="${SPARRING_IMAGE_REPOSITORY:-ghcr.io/sparring/sparring}"
DOCKER="${DOCKER:-docker}"
PUSH=0
DRY_RUN=0
FLAVORS=(cpu gpu)
PLATFORM=""

usage() {
  cat <<USAGE
Usage: images/build.sh [options]

Build the Sparring runtime images, tagged with the project version from sparring/__init__.py:
  <repository>:<version>-cpu   (images/Dockerfile.cpu)
  <repository>:<version>-gpu   (images/Dockerfile.gpu)

Options:
  --repository REPO   image repository (default: \$SPARRING_IMAGE_REPOSITORY or
                      ghcr.io/sparring/sparring; the Helm value image.repository must match)
  --only cpu|gpu      build one flavor only
  --platform P        passed to docker build (e.g. linux/amd64)
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
        cpu|gpu) FLAVORS=("$2") ;;
        *) echo "error: --only takes cpu or gpu, got '${2:-}'" >&2; exit 2 ;;
      esac
      shift 2 ;;
    --platform) PLATFORM="${2:?--platform needs a value}"; shift 2 ;;
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
  args=(build -f "$ROOT/images/Dockerfile.$flavor" -t "$ref" --build-arg "SPARRING_VERSION=$VERSION")
  if [[ -n "$PLATFORM" ]]; then args+=(--platform "$PLATFORM"); fi
  run "$DOCKER" "${args[@]}" "$ROOT"
  if [[ $PUSH -eq 1 ]]; then run "$DOCKER" push "$ref"; fi
done
