#!/usr/bin/env bash
# Validates deploy/k8s offline: renders every overlay (and namespace/) with `kubectl kustomize`,
# checks each rendered object (and the monitoring/ examples) against the
# OpenAPI schemas of Kubernetes ${K8S_VERSION} with `kubernetes-validate
# --strict` (unknown fields fail), and runs yamllint with deploy/k8s/.yamllint
# over every YAML file here. It also proves --strict bites: a rendered
# Deployment with an unknown field must be rejected. The custom resources
# (KEDA's ScaledObject, the Prometheus Operator's PodMonitor and PrometheusRule) have no schema
# there: kubernetes-validate only warns about them, any other kind without a
# schema fails, and //tests/k8s:manifest_policy_test checks their structure.
# The alternatives for a cluster without those CRDs (components/prometheus-adapter:
# HPAs in place of the ScaledObjects; components/without-prometheus-operator) are
# rendered and validated on the cpu overlay: no custom resource is left.
#
#   deploy/k8s/validate.sh       (also the Bazel test //tests/k8s:manifests_validate_test)
#
# Needs kubectl (>= 1.27: kustomize v5) and, for python3 (or $PYTHON), the
# PyPI packages kubernetes-validate and yamllint (tools/bootstrap.sh).
set -euo pipefail

K8S_VERSION="${K8S_VERSION:-1.32.0}"

# The manifests: under Bazel, from the runfiles; else beside this script.
if [ -n "${TEST_SRCDIR:-}" ]; then
  src="${TEST_SRCDIR}/${TEST_WORKSPACE:-hybridserve}/deploy/k8s"
else
  src="$(cd "$(dirname "$0")" && pwd)"
fi
work="$(mktemp -d "${TEST_TMPDIR:-/tmp}/k8s-validate.XXXXXX")"
trap 'rm -rf "$work"' EXIT
# A real copy: kustomize refuses files reached through symlinks that lead
# outside the kustomization root (Bazel's runfiles are such symlinks).
cp -rL "$src" "$work/k8s"
k8s="$work/k8s"

PYTHON="${PYTHON:-python3}"
if ! "$PYTHON" -c "import kubernetes_validate, yamllint" 2>/dev/null; then
  PYTHON=/usr/bin/python3
fi
"$PYTHON" -c "import kubernetes_validate, yamllint" 2>/dev/null || {
  echo "validate.sh: kubernetes-validate and yamllint are not installed for python3 (run tools/bootstrap.sh)" >&2
  exit 1
}
command -v kubectl >/dev/null || { echo "validate.sh: kubectl not found" >&2; exit 1; }

failed=0
check() {  # check NAME COMMAND...: runs it, prints one line, remembers failure
  local name=$1
  shift
  if "$@" >"$work/out" 2>&1; then
    echo "PASS $name"
  else
    echo "FAIL $name"
    sed 's/^/    /' "$work/out"
    failed=$((failed + 1))
  fi
}
validate() { "$PYTHON" -m kubernetes_validate --strict --quiet -k "$K8S_VERSION" "$@"; }
# The kinds that have no schema in kubernetes-validate: CRDs whose structure
# the policy test checks.
CUSTOM_KINDS='ScaledObject with api version keda.sh/v1alpha1|(PodMonitor|PrometheusRule) with api version monitoring.coreos.com/v1'
validate_known() {  # validate, and fail on a kind without a schema but CUSTOM_KINDS
  validate "$@" >"$work/validate.out" 2>&1 || { cat "$work/validate.out"; return 1; }
  if grep "Couldn't find schema" "$work/validate.out" | grep -Evq "kind ($CUSTOM_KINDS) for"; then
    grep "Couldn't find schema" "$work/validate.out" | grep -Ev "kind ($CUSTOM_KINDS) for"
    return 1
  fi
}

# Every overlay, and the Namespace's own kustomization (applied once).
for dir in "$k8s"/overlays/*/ "$k8s"/namespace/; do
  name="$(basename "$dir")"
  rel="${dir#"$k8s"/}"
  check "render ${rel%/}" kubectl kustomize "$dir" -o "$work/$name.yaml"
  [ -s "$work/$name.yaml" ] || continue
  objects="$(grep -c '^kind: ' "$work/$name.yaml" || true)"
  custom="$(grep -cE '^kind: (ScaledObject|PodMonitor|PrometheusRule)$' "$work/$name.yaml" || true)"
  check "kubernetes-validate --strict -k $K8S_VERSION ${rel%/} ($objects objects, $custom custom: structure in the policy test)" \
    validate_known "$work/$name.yaml"
done
# The cert-manager example with the settings (cert-manager's CRDs: rendered,
# not validated; the policy test checks it).
check "render components/mtls/cert-manager" kubectl kustomize "$k8s/components/mtls/cert-manager" -o "$work/certs.yaml"
# Without KEDA and the Prometheus Operator: the cpu overlay with
# prometheus-adapter's HPAs and without the Prometheus Operator's objects.
mkdir -p "$k8s/alternatives/cpu-no-crds"
printf 'resources: [../../overlays/cpu]\ncomponents: [%s, %s]\n' ../../components/prometheus-adapter \
  ../../components/without-prometheus-operator >"$k8s/alternatives/cpu-no-crds/kustomization.yaml"
check "render cpu + components/prometheus-adapter + components/without-prometheus-operator" \
  kubectl kustomize "$k8s/alternatives/cpu-no-crds" -o "$work/alt.yaml"
validate_alternative() {  # exactly the two HPAs, no custom resource, and valid with no warning
  [ "$(grep -c '^kind: HorizontalPodAutoscaler$' "$work/alt.yaml")" = 2 ] || return 1
  ! grep -Eq '^kind: (ScaledObject|PodMonitor|PrometheusRule)$' "$work/alt.yaml" || return 1
  validate "$work/alt.yaml" >"$work/validate.out" 2>&1 || { cat "$work/validate.out"; return 1; }
  ! grep "Couldn't find schema" "$work/validate.out"
}
[ -s "$work/alt.yaml" ] && check "kubernetes-validate --strict that (2 HPAs, no custom resource)" validate_alternative
rm -rf "$k8s/alternatives"
for f in "$k8s"/monitoring/*.yaml; do
  check "kubernetes-validate --strict -k $K8S_VERSION monitoring/$(basename "$f")" validate "$f"
done
check "yamllint -c deploy/k8s/.yamllint --strict deploy/k8s" \
  "$PYTHON" -m yamllint -c "$k8s/.yamllint" --strict "$k8s"

# --strict must reject what the API server would drop: an unknown field.
if [ -s "$work/cpu.yaml" ]; then
  sed 's/^  revisionHistoryLimit: 5$/  revisionHistoryLimit: 5\n  replicaz: 2/' "$work/cpu.yaml" >"$work/broken.yaml"
  if grep -q replicaz "$work/broken.yaml" && ! validate "$work/broken.yaml" >/dev/null 2>&1; then
    echo "PASS kubernetes-validate --strict rejects an unknown field"
  else
    echo "FAIL kubernetes-validate --strict accepted a Deployment with an unknown field"
    failed=$((failed + 1))
  fi
fi

if [ "$failed" -ne 0 ]; then
  echo "validate.sh: $failed check(s) failed"
  exit 1
fi
echo "validate.sh: every check passed (Kubernetes $K8S_VERSION schemas)"
