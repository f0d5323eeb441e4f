#!/usr/bin/env bash
# Smoke test of a running local cluster (cluster.sh up): versions, GPU nodes,
# scheduling, PDB-guarded eviction (429), eviction honouring the grace period,
# ReplicaSet replacement, a Job pod, Prometheus. Cleans up its namespace.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
eval "$("$HERE/cluster.sh" env)"
K="$GPUEFF_LOCALCLUSTER_BIN/kubectl"
NS=gpueff-smoke
STATE="$GPUEFF_LOCALCLUSTER_STATE"
API="$(awk '/server:/{print $2; exit}' "$KUBECONFIG")"
ok() { echo "ok: $*"; }
fail() { echo "FAIL: $*" >&2; exit 1; }
curl_k() { curl -s --cacert "$STATE/pki/ca.crt" --cert "$STATE/pki/admin.crt" --key "$STATE/pki/admin.key" "$@"; }
wait_for() { # seconds description command...
  local t=$1 what=$2; shift 2
  local deadline=$((SECONDS + t))
  until "$@" > /dev/null 2>&1; do ((SECONDS < deadline)) || fail "timeout: $what"; sleep 0.3; done
}
running_pods() { # selector -> names of Running, Ready, not-terminating pods
  "$K" -n $NS get pods -l "$1" -o json | jq -r '.items[] | select(.metadata.deletionTimestamp == null and .status.phase == "Running")
    | select(any(.status.conditions[]?; .type == "Ready" and .status == "True")) | .metadata.name'
}
has_running() { [[ -n "$(running_pods "$1")" ]]; }

v="$("$K" version)"; echo "$v"
[[ "$v" == *"Client Version: v1.36.3"* ]] || fail "client version"
[[ "$v" == *"Server Version: v1.36.3"* ]] || fail "server version"
ok "kubectl/apiserver v1.36.3"

nodes_ready=$("$K" get nodes -o json | jq '[.items[] | select(.status.allocatable["nvidia.com/gpu"] != null)
  | select(any(.status.conditions[]; .type == "Ready" and .status == "True"))] | length')
((nodes_ready >= 1)) || fail "no Ready GPU nodes"
ok "$nodes_ready Ready nodes with nvidia.com/gpu"

"$K" delete ns $NS --ignore-not-found --wait=true > /dev/null
"$K" create ns $NS > /dev/null
wait_for 30 "default SA in $NS" "$K" -n $NS get sa default
"$K" -n $NS apply -f - > /dev/null << 'EOF'
apiVersion: apps/v1
kind: Deployment
metadata: {name: gpu-app}
spec:
  replicas: 1
  selector: {matchLabels: {app: gpu-app}}
  template:
    metadata: {labels: {app: gpu-app}}
    spec:
      terminationGracePeriodSeconds: 5
      containers:
      - name: main
        image: example.invalid/trainer:latest
        resources: {limits: {nvidia.com/gpu: 1}}
---
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata: {name: gpu-app}
spec:
  minAvailable: 1
  selector: {matchLabels: {app: gpu-app}}
EOF
wait_for 60 "gpu-app pod Running" has_running app=gpu-app
POD=$(running_pods app=gpu-app | head -1)
"$K" -n $NS get pod "$POD" -o wide
ip=$("$K" -n $NS get pod "$POD" -o jsonpath='{.status.podIP}'); [[ -n "$ip" ]] || fail "no podIP"
ok "pod $POD Running on $("$K" -n $NS get pod "$POD" -o jsonpath='{.spec.nodeName}') ip $ip"
wait_for 30 "PDB status" test "$("$K" -n $NS get pdb gpu-app -o jsonpath='{.status.currentHealthy}')" = 1

evict() {
  curl_k -o /tmp/gpueff-smoke-evict.out -w '%{http_code}' -X POST -H 'Content-Type: application/json' \
    "$API/api/v1/namespaces/$NS/pods/$1/eviction" \
    -d "{\"apiVersion\":\"policy/v1\",\"kind\":\"Eviction\",\"metadata\":{\"name\":\"$1\",\"namespace\":\"$NS\"}}"
}
code=$(evict "$POD"); [[ "$code" == 429 ]] || { cat /tmp/gpueff-smoke-evict.out; fail "eviction with PDB: HTTP $code, want 429"; }
ok "eviction refused by PDB: 429 ($(jq -r .message /tmp/gpueff-smoke-evict.out))"

"$K" -n $NS delete pdb gpu-app > /dev/null
t0=$(date +%s.%N)
code=$(evict "$POD"); [[ "$code" == 201 || "$code" == 200 ]] || { cat /tmp/gpueff-smoke-evict.out; fail "eviction: HTTP $code"; }
ok "eviction accepted: $code"
"$K" -n $NS get pod "$POD" -o jsonpath='{.metadata.deletionTimestamp} {.status.phase}{"\n"}'
gone() { ! "$K" -n $NS get pod "$POD" > /dev/null 2>&1; }
wait_for 60 "evicted pod gone" gone
t1=$(date +%s.%N)
secs=$(echo "$t1 - $t0" | bc)
(($(echo "$secs >= 4.9" | bc))) || fail "pod went away after ${secs}s, before its 5s grace period"
ok "evicted pod gone after ${secs}s (grace 5s)"
wait_for 60 "replacement Running" has_running app=gpu-app
ok "replacement $(running_pods app=gpu-app | head -1) Running"

"$K" -n $NS apply -f - > /dev/null << 'EOF'
apiVersion: batch/v1
kind: Job
metadata: {name: gpu-job}
spec:
  template:
    spec:
      restartPolicy: Never
      containers:
      - name: main
        image: example.invalid/batch:latest
        resources: {limits: {nvidia.com/gpu: 1}}
EOF
wait_for 60 "job pod Running" has_running batch.kubernetes.io/job-name=gpu-job
ok "job pod $(running_pods batch.kubernetes.io/job-name=gpu-job) Running"

curl -sf "$GPUEFF_PROMETHEUS_URL/api/v1/query?query=time()" | jq -e '.status == "success"' > /dev/null || fail "prometheus query"
ok "prometheus answers /api/v1/query at $GPUEFF_PROMETHEUS_URL"

"$K" delete ns $NS --wait=false > /dev/null
echo "SMOKE OK"
