#!/usr/bin/env bash
# Writes the release artifacts of deploy/k8s: one YAML file per overlay (and
# one for namespace/), rendered with `kubectl kustomize`, both images (the
# workers' hybridserve, the OpenAI gateway's hybridserve-gateway) pinned to
# their digests, every object labelled app.kubernetes.io/version.
#
#   deploy/k8s/render.sh --version 1.2.3 --digest sha256:<64 hex> \
#       --gateway-digest sha256:<64 hex> [--image registry.example/hybridserve] \
#       [--gateway-image registry.example/hybridserve-gateway] [--out DIR]
#
# --gateway-image defaults to <--image>-gateway.
#
# Files: DIR/hybridserve-<version>-<overlay>.yaml and
# DIR/hybridserve-<version>-namespace.yaml (DIR: ./release by default). Apply
# the namespace file once, then one overlay's. Checked by //tests/k8s:render_test
# (every overlay rendered and validated, every image on the digest).
set -euo pipefail

usage() {
  echo "usage: $0 --version VERSION --digest sha256:<64 hex> --gateway-digest sha256:<64 hex> [--image NAME]" \
    "[--gateway-image NAME] [--out DIR]" >&2
  exit 2
}

version="" digest="" image="hybridserve" out="release" gateway_digest="" gateway_image=""
while [ $# -gt 0 ]; do
  case "$1" in
    --version) version="${2:-}"; shift 2 ;;
    --digest) digest="${2:-}"; shift 2 ;;
    --image) image="${2:-}"; shift 2 ;;
    --gateway-digest) gateway_digest="${2:-}"; shift 2 ;;
    --gateway-image) gateway_image="${2:-}"; shift 2 ;;
    --out) out="${2:-}"; shift 2 ;;
    --version=*) version="${1#*=}"; shift ;;
    --digest=*) digest="${1#*=}"; shift ;;
    --image=*) image="${1#*=}"; shift ;;
    --gateway-digest=*) gateway_digest="${1#*=}"; shift ;;
    --gateway-image=*) gateway_image="${1#*=}"; shift ;;
    --out=*) out="${1#*=}"; shift ;;
    *) echo "render.sh: unknown argument $1" >&2; usage ;;
  esac
done
[[ "$version" =~ ^[0-9A-Za-z][0-9A-Za-z._+-]*$ ]] || {
  echo "render.sh: --version must be a release version (letters, digits, . _ + -), got '$version'" >&2
  exit 2
}
[[ "$digest" =~ ^sha256:[0-9a-f]{64}$ ]] || {
  echo "render.sh: --digest must be the image's digest, sha256: and 64 hex digits, got '$digest'" >&2
  exit 2
}
[[ "$gateway_digest" =~ ^sha256:[0-9a-f]{64}$ ]] || {
  echo "render.sh: --gateway-digest must be the gateway image's digest, sha256: and 64 hex digits, got" \
    "'$gateway_digest'" >&2
  exit 2
}
# A name: a registry's port may have a colon, the last path component not (a tag).
[[ "$image" =~ ^[a-z0-9][a-z0-9._/:-]*$ && "$image" != *@* && "${image##*/}" != *:* ]] || {
  echo "render.sh: --image must be an image name without tag or digest, got '$image'" >&2
  exit 2
}
gateway_image="${gateway_image:-$image-gateway}"
[[ "$gateway_image" =~ ^[a-z0-9][a-z0-9._/:-]*$ && "$gateway_image" != *@* && "${gateway_image##*/}" != *:* ]] || {
  echo "render.sh: --gateway-image must be an image name without tag or digest, got '$gateway_image'" >&2
  exit 2
}
command -v kubectl >/dev/null || { echo "render.sh: kubectl not found" >&2; exit 1; }

src="$(cd "$(dirname "$0")" && pwd)"
work="$(mktemp -d "${TMPDIR:-/tmp}/k8s-render.XXXXXX")"
trap 'rm -rf "$work"' EXIT
cp -rL "$src" "$work/k8s"
mkdir -p "$out"

# render NAME DIR: an overlay wrapping DIR with the image on the digest and
# the version label (not on selectors: a release never changes them).
render() {
  local name=$1 dir=$2 wrap="$work/k8s/release/$1"
  mkdir -p "$wrap"
  cat >"$wrap/kustomization.yaml" <<KUSTOMIZATION
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
  - ../../$dir
images:
  - name: hybridserve
    newName: $image
    digest: $digest
  - name: hybridserve-gateway
    newName: $gateway_image
    digest: $gateway_digest
labels:
  - pairs:
      app.kubernetes.io/version: "$version"
KUSTOMIZATION
  local file="$out/hybridserve-$version-$name.yaml"
  {
    echo "# hybridserve $version, deploy/k8s/$dir, images $image@$digest, $gateway_image@$gateway_digest"
    echo "# rendered by deploy/k8s/render.sh; apply hybridserve-$version-namespace.yaml once first."
    kubectl kustomize "$wrap"
  } >"$file.tmp"
  mv "$file.tmp" "$file"
  echo "$file"
}

render namespace namespace
for dir in "$work"/k8s/overlays/*/; do
  name="$(basename "$dir")"
  render "$name" "overlays/$name"
done
