#!/usr/bin/env bash
# Local Kubernetes test environment: etcd + kube-apiserver + kube-controller-manager
# + kube-scheduler + KWOK (fake GPU nodes) + Prometheus, all as plain processes
# on 127.0.0.1, built by ./build.sh (no containers, no downloaded binaries).
#
# Usage: cluster.sh up [--nodes N] | down [--purge] | status | env | logs [COMPONENT] [-f]
#        cluster.sh add-nodes N [--gpus 8] [--models "M1,M2"] [--prefix gpu-node-]
#          (models: `gpu-efficiency-sim models`; default a Hopper and an Ampere node, round-robin)
#        cluster.sh delete-nodes PREFIX
#        cluster.sh prometheus-up | prometheus-down
#        cluster.sh up --metrics victoriametrics | victoriametrics-cluster   (instead of Prometheus)
#        cluster.sh victoriametrics-up [--cluster] | victoriametrics-down    (beside Prometheus)
#        cluster.sh vmstorage-down N | vmstorage-up N   (the cluster's storage node N, 1 or 2)
#        cluster.sh kubectl ARGS...     (kubectl from the cache, with our kubeconfig)
# See README.md in this directory for the interface (env vars, ports, files).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
STATE="${GPUEFF_STATE_DIR:-/tmp/gpueff-localcluster}"
HOST=127.0.0.1
# GPUEFF_PORT_OFFSET moves every default port at once, so several clusters (each with its own
# GPUEFF_STATE_DIR) run side by side: the e2e suite's parallel workers use it.
OFF="${GPUEFF_PORT_OFFSET:-0}"
[[ "$OFF" =~ ^[0-9]+$ ]] || { echo "[localcluster] ERROR: GPUEFF_PORT_OFFSET must be a number, got '$OFF'" >&2; exit 1; }
ETCD_PORT="${GPUEFF_ETCD_PORT:-$((12379 + OFF))}"
ETCD_PEER_PORT="${GPUEFF_ETCD_PEER_PORT:-$((12380 + OFF))}"
APISERVER_PORT="${GPUEFF_APISERVER_PORT:-$((16443 + OFF))}"
KCM_PORT="${GPUEFF_KCM_PORT:-$((17257 + OFF))}"
SCHEDULER_PORT="${GPUEFF_SCHEDULER_PORT:-$((17259 + OFF))}"
KWOK_PORT="${GPUEFF_KWOK_PORT:-$((17247 + OFF))}"
PROM_PORT="${GPUEFF_PROM_PORT:-$((19090 + OFF))}"
PROM_SCRAPE_INTERVAL="${GPUEFF_PROM_SCRAPE_INTERVAL:-1s}"
PROM_RETENTION="${GPUEFF_PROM_RETENTION:-2h}"
# VictoriaMetrics (optional, see README.md): the single-node server, or the cluster's vminsert,
# vmselect and two vmstorage nodes fed by vmagent; all scrape the same file-SD targets as Prometheus.
VM_PORT="${GPUEFF_VM_PORT:-$((18428 + OFF))}"
VMAGENT_PORT="${GPUEFF_VMAGENT_PORT:-$((18429 + OFF))}"
VMINSERT_PORT="${GPUEFF_VMINSERT_PORT:-$((18480 + OFF))}"
VMSELECT_PORT="${GPUEFF_VMSELECT_PORT:-$((18481 + OFF))}"
VMSTORAGE_PORT_BASE="${GPUEFF_VMSTORAGE_PORT_BASE:-$((18500 + OFF))}"  # node N: base+10N, +1, +2
# VictoriaMetrics hides the newest -search.latencyOffset of data from queries (default 30s): idle
# onsets and faults would be judged 30 s late. Two scrape intervals (see docs/install.md).
VM_LATENCY_OFFSET="${GPUEFF_VM_LATENCY_OFFSET:-2s}"
SERVICE_CIDR="${GPUEFF_SERVICE_CIDR:-10.96.0.0/16}"
WAIT_TIMEOUT="${GPUEFF_WAIT_TIMEOUT:-120}"
NODE_STATUS_PERIOD_S="${GPUEFF_KWOK_NODE_STATUS_PERIOD_S:-}"  # fake nodes' status heartbeat (kwok.yaml)
NODE_LEASE_S="${GPUEFF_KWOK_NODE_LEASE_DURATION_S:-40}"  # fake nodes' lease, renewed every quarter of it
# DRA device taints (single-GPU quarantine): in Kubernetes 1.36 DeviceTaintRule is served only as
# resource.k8s.io/v1beta2, a beta API off by default, and needs the DRADeviceTaintRules gate (beta,
# off by default; DRADeviceTaints is on) in the API server, scheduler and controller-manager.
# Set either to '' to start a cluster without them.
FEATURE_GATES="${GPUEFF_FEATURE_GATES-DRADeviceTaintRules=true}"
RUNTIME_CONFIG="${GPUEFF_RUNTIME_CONFIG-resource.k8s.io/v1beta2=true}"
gates() { [[ -n "$FEATURE_GATES" ]] && echo "--feature-gates=$FEATURE_GATES"; return 0; }

DEFAULT_NODES=2
DEFAULT_GPUS=8
DEFAULT_PREFIX="gpu-node-"

PKI="$STATE/pki"
RUN="$STATE/run"
LOGS="$STATE/logs"
KUBECONFIG_FILE="$STATE/kubeconfig"
PROM_DIR="$STATE/prometheus"
VM_DIR="$STATE/victoriametrics"
CONTROL_PLANE=(etcd kube-apiserver kube-controller-manager kube-scheduler kwok)
COMPONENTS=("${CONTROL_PLANE[@]}" prometheus)  # the metrics backend's, once main() has read it

log() { echo "[localcluster] $*" >&2; }
die() { echo "[localcluster] ERROR: $*" >&2; exit 1; }

# ---------------------------------------------------------------- binaries --
BIN=""
bindir() {
  [[ -n "$BIN" ]] && return 0
  if [[ -n "${GPUEFF_LOCALCLUSTER_BIN:-}" ]]; then
    BIN="$GPUEFF_LOCALCLUSTER_BIN"
  else
    BIN="$("$HERE/build.sh" | tail -n 1)"
  fi
  [[ -x "$BIN/kube-apiserver" ]] || die "no binaries in $BIN (run $HERE/build.sh)"
}
kubectl_() { bindir; "$BIN/kubectl" --kubeconfig "$KUBECONFIG_FILE" "$@"; }

# -------------------------------------------------------------- processes --
pidfile() { echo "$RUN/$1.pid"; }

# pid of a running component, verified against /proc (stale pid files are ignored)
running_pid() {
  local name=$1 f pid cmd
  f="$(pidfile "$name")"
  [[ -f "$f" ]] || return 1
  pid="$(cat "$f" 2>/dev/null || true)"
  [[ "$pid" =~ ^[0-9]+$ ]] || { rm -f "$f"; return 1; }
  cmd="$(cmdline_of "$pid")"
  if [[ "$cmd" == *"$name"* && "$cmd" == *"$STATE"* ]]; then
    echo "$pid"; return 0
  fi
  rm -f "$f"
  return 1
}

# cmdline_of PID: its command line, space-separated; empty once it has exited. A live process reads
# empty for an instant while it execs (setsid execing the component: measured 2 reads in 6,000), so
# an empty read of a live process is read again rather than taken for an exit ("exited while
# waiting" for a component that was up, seen in CI and in the scale bench).
cmdline_of() {
  local pid=$1 cmd i
  for ((i = 0; i < 20; i++)); do
    cmd="$(tr '\0' ' ' < "/proc/$pid/cmdline" 2> /dev/null || true)"
    if [[ -n "$cmd" ]] || ! alive "$pid"; then break; fi
    sleep 0.05
  done
  echo "$cmd"
}

# start NAME ARGS...: run in its own session (process group), log to $LOGS/NAME.log
start_proc() {
  local name=$1; shift
  mkdir -p "$RUN" "$LOGS"
  echo "==== $(date -Is) starting: $*" >> "$LOGS/$name.log"
  # 8>&-: do not leak the state lock (see lock_state) into the long-running child
  setsid "$@" >> "$LOGS/$name.log" 2>&1 < /dev/null 8>&- &
  local pid=$! i
  # Until the forked shell has exec'd setsid and setsid the component, its cmdline is this
  # script's, then setsid's, and running_pid would take it for a stale pid and drop the pidfile
  # ("exited while waiting"); seen once under load. Wait for the component itself.
  local cmd
  for ((i = 0; i < 100; i++)); do
    cmd="$(cmdline_of "$pid")"
    [[ "$cmd" == *"$name"* && "$cmd" != "setsid "* ]] && break
    alive "$pid" || break
    sleep 0.05
  done
  echo "$pid" > "$(pidfile "$name")"
}

# alive PID: exists and is not a zombie (an exited child of ours that pid 1 has
# not reaped yet still answers kill -0)
alive() { [[ -r "/proc/$1/status" ]] && ! grep -q '^State:[[:space:]]*Z' "/proc/$1/status" 2> /dev/null; }

stop_proc() {
  local name=$1 pid i
  if ! pid="$(running_pid "$name")"; then
    rm -f "$(pidfile "$name")"; return 0
  fi
  kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true
  for ((i = 0; i < 100; i++)); do
    alive "$pid" || break
    sleep 0.1
  done
  if alive "$pid"; then
    log "$name (pid $pid) did not stop in 10s, killing"
    kill -KILL -- "-$pid" 2>/dev/null || kill -KILL "$pid" 2>/dev/null || true
  fi
  rm -f "$(pidfile "$name")"
  log "stopped $name (pid $pid)"
}

# A port held by a process of a previous run of ours (same state dir in its
# command line) is freed; a port held by anything else is an error.
free_port() {
  local name=$1 port=$2 pids pid cmd
  pids="$(ss -Htlnp "sport = :$port" 2>/dev/null | grep -o 'pid=[0-9]*' | cut -d= -f2 | sort -u || true)"
  [[ -z "$pids" ]] && return 0
  for pid in $pids; do
    cmd="$(tr '\0' ' ' < "/proc/$pid/cmdline" 2>/dev/null || true)"
    if [[ "$cmd" == *"$STATE"* ]]; then
      log "port $port ($name) held by a leftover process of ours (pid $pid), killing it"
      kill -TERM "$pid" 2>/dev/null || true
      sleep 1
      kill -KILL "$pid" 2>/dev/null || true
    else
      die "port $port ($name) is in use by pid $pid: ${cmd:-unknown}; set GPUEFF_*_PORT to move ours"
    fi
  done
  sleep 0.2
}

fail_with_log() {
  local name=$1; shift
  echo "[localcluster] ERROR: $* -- last lines of $LOGS/$name.log:" >&2
  tail -n 40 "$LOGS/$name.log" >&2 || true
  exit 1
}

# wait_until NAME DESCRIPTION COMMAND...: poll COMMAND until it succeeds; the
# component must stay alive meanwhile.
wait_until() {
  local name=$1 what=$2; shift 2
  local deadline=$((SECONDS + WAIT_TIMEOUT))
  until "$@" > /dev/null 2>&1; do
    if [[ "$name" != - ]] && ! running_pid "$name" > /dev/null; then
      fail_with_log "$name" "$name exited while waiting for $what"
    fi
    if ((SECONDS >= deadline)); then
      fail_with_log "${name/#-/kube-apiserver}" "timed out after ${WAIT_TIMEOUT}s waiting for $what"
    fi
    sleep 0.3
  done
}

# ------------------------------------------------------------------- PKI --
gen_pki() {
  [[ -f "$PKI/.done-v2" ]] && return 0
  log "generating certificates in $PKI"
  rm -rf "$PKI"; mkdir -p "$PKI"
  (
    cd "$PKI"
    umask 077
    openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.crt -days 3650 \
      -subj "/CN=gpueff-localcluster-ca" -addext "basicConstraints=critical,CA:TRUE" \
      -addext "keyUsage=critical,keyCertSign,cRLSign,digitalSignature" 2> /dev/null
    sign() { # name subject extensions
      openssl req -newkey rsa:2048 -nodes -keyout "$1.key" -out "$1.csr" -subj "$2" 2> /dev/null
      printf '%s\n' "$3" > "$1.ext"
      openssl x509 -req -in "$1.csr" -CA ca.crt -CAkey ca.key -CAcreateserial -out "$1.crt" \
        -days 3650 -extfile "$1.ext" 2> /dev/null
      rm -f "$1.csr" "$1.ext"
    }
    client='basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=clientAuth'
    sign apiserver "/CN=kube-apiserver" "basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth
subjectAltName=IP:127.0.0.1,IP:10.96.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local"
    sign admin "/O=system:masters/CN=admin" "$client"
    sign kube-controller-manager "/CN=system:kube-controller-manager" "$client"
    sign kube-scheduler "/CN=system:kube-scheduler" "$client"
    sign kwok "/O=system:masters/CN=kwok" "$client"
    sign apiserver-kubelet-client "/O=system:masters/CN=kube-apiserver-kubelet-client" "$client"
    # front proxy (request-header authentication for aggregated APIs), its own CA
    openssl req -x509 -newkey rsa:2048 -nodes -keyout front-proxy-ca.key -out front-proxy-ca.crt -days 3650 \
      -subj "/CN=gpueff-localcluster-front-proxy-ca" -addext "basicConstraints=critical,CA:TRUE" \
      -addext "keyUsage=critical,keyCertSign,cRLSign,digitalSignature" 2> /dev/null
    openssl req -newkey rsa:2048 -nodes -keyout front-proxy-client.key -out front-proxy-client.csr \
      -subj "/CN=front-proxy-client" 2> /dev/null
    printf '%s\n' "$client" > front-proxy-client.ext
    openssl x509 -req -in front-proxy-client.csr -CA front-proxy-ca.crt -CAkey front-proxy-ca.key \
      -CAcreateserial -out front-proxy-client.crt -days 3650 -extfile front-proxy-client.ext 2> /dev/null
    rm -f front-proxy-client.csr front-proxy-client.ext front-proxy-ca.srl
    openssl genrsa -out sa.key 2048 2> /dev/null
    openssl rsa -in sa.key -pubout -out sa.pub 2> /dev/null
    rm -f ca.srl
  )
  touch "$PKI/.done-v2"
}

write_kubeconfig() { # file user
  local file=$1 user=$2
  cat > "$file.tmp" << EOF
apiVersion: v1
kind: Config
clusters:
- name: gpueff-local
  cluster:
    server: https://$HOST:$APISERVER_PORT
    certificate-authority-data: $(base64 -w0 < "$PKI/ca.crt")
users:
- name: $user
  user:
    client-certificate-data: $(base64 -w0 < "$PKI/$user.crt")
    client-key-data: $(base64 -w0 < "$PKI/$user.key")
contexts:
- name: gpueff-local
  context:
    cluster: gpueff-local
    user: $user
current-context: gpueff-local
EOF
  chmod 600 "$file.tmp"
  mv "$file.tmp" "$file"
}

check_settings() {
  # Before anything is made or started: a bad value changes nothing.
  [[ -z "$NODE_STATUS_PERIOD_S" || "$NODE_STATUS_PERIOD_S" =~ ^[1-9][0-9]*$ ]] \
    || die "GPUEFF_KWOK_NODE_STATUS_PERIOD_S must be a whole number of seconds, not '$NODE_STATUS_PERIOD_S'"
  [[ "$NODE_LEASE_S" =~ ^[1-9][0-9]+$ ]] \
    || die "GPUEFF_KWOK_NODE_LEASE_DURATION_S must be a whole number of seconds from 10, not '$NODE_LEASE_S'"
}

write_configs() {
  mkdir -p "$STATE/kubeconfigs"
  write_kubeconfig "$KUBECONFIG_FILE" admin
  local c
  for c in kube-controller-manager kube-scheduler kwok; do
    write_kubeconfig "$STATE/kubeconfigs/$c" "$c"
  done
  cp "$HERE/kwok.yaml" "$STATE/kwok.yaml"
  if [[ -n "$NODE_STATUS_PERIOD_S" ]]; then  # kwok.yaml: the node-heartbeat stage's delay
    sed -i \
      -e "s/^\(    durationMilliseconds: \)[0-9]*\(  # node-heartbeat period\)/\1$((NODE_STATUS_PERIOD_S * 1000))\2/" \
      -e "s/^\(    jitterDurationMilliseconds: \)[0-9]*\(  # node-heartbeat jitter\)/\1$((NODE_STATUS_PERIOD_S * 1100))\2/" \
      "$STATE/kwok.yaml"
  fi
}

# ------------------------------------------------------------- components --
curl_k() { curl -sf --max-time 2 --cacert "$PKI/ca.crt" --cert "$PKI/admin.crt" --key "$PKI/admin.key" "$@"; }

start_etcd() {
  running_pid etcd > /dev/null && return 0
  free_port etcd "$ETCD_PORT"; free_port etcd-peer "$ETCD_PEER_PORT"
  mkdir -p "$STATE/etcd"
  start_proc etcd "$BIN/etcd" --name gpueff --data-dir "$STATE/etcd" \
    --listen-client-urls "http://$HOST:$ETCD_PORT" --advertise-client-urls "http://$HOST:$ETCD_PORT" \
    --listen-peer-urls "http://$HOST:$ETCD_PEER_PORT" --initial-advertise-peer-urls "http://$HOST:$ETCD_PEER_PORT" \
    --initial-cluster "gpueff=http://$HOST:$ETCD_PEER_PORT" \
    --unsafe-no-fsync --quota-backend-bytes=4294967296 --log-level=warn
  wait_until etcd "etcd /health" curl -sf --max-time 2 "http://$HOST:$ETCD_PORT/health"
  log "etcd ready on $HOST:$ETCD_PORT"
}

start_apiserver() {
  running_pid kube-apiserver > /dev/null && return 0
  free_port kube-apiserver "$APISERVER_PORT"
  mkdir -p "$STATE/apiserver"
  local adv=() extra=()
  [[ -n "${GPUEFF_ADVERTISE_ADDRESS:-}" ]] && adv=(--advertise-address "$GPUEFF_ADVERTISE_ADDRESS")
  [[ -n "$FEATURE_GATES" ]] && extra+=("--feature-gates=$FEATURE_GATES")
  [[ -n "$RUNTIME_CONFIG" ]] && extra+=("--runtime-config=$RUNTIME_CONFIG")
  start_proc kube-apiserver "$BIN/kube-apiserver" \
    --etcd-servers "http://$HOST:$ETCD_PORT" \
    --bind-address "$HOST" --secure-port "$APISERVER_PORT" "${adv[@]}" \
    --cert-dir "$STATE/apiserver" \
    --tls-cert-file "$PKI/apiserver.crt" --tls-private-key-file "$PKI/apiserver.key" \
    --client-ca-file "$PKI/ca.crt" \
    --requestheader-client-ca-file "$PKI/front-proxy-ca.crt" \
    --requestheader-allowed-names front-proxy-client \
    --requestheader-username-headers X-Remote-User \
    --requestheader-group-headers X-Remote-Group \
    --requestheader-extra-headers-prefix X-Remote-Extra- \
    --proxy-client-cert-file "$PKI/front-proxy-client.crt" \
    --proxy-client-key-file "$PKI/front-proxy-client.key" \
    --kubelet-client-certificate "$PKI/apiserver-kubelet-client.crt" \
    --kubelet-client-key "$PKI/apiserver-kubelet-client.key" \
    --service-account-issuer https://kubernetes.default.svc \
    --service-account-key-file "$PKI/sa.pub" \
    --service-account-signing-key-file "$PKI/sa.key" \
    --authorization-mode Node,RBAC \
    --service-cluster-ip-range "$SERVICE_CIDR" \
    --allow-privileged=true \
    --profiling=false "${extra[@]}" \
    --v=1
  wait_until kube-apiserver "kube-apiserver /readyz" curl_k "https://$HOST:$APISERVER_PORT/readyz"
  log "kube-apiserver ready on https://$HOST:$APISERVER_PORT"
}

node_grace_s() {
  # How long the node lifecycle controller waits for a renewal before it calls a node unreachable
  # (and taints and evicts its pods): 50 s, Kubernetes' default, or the lease's whole duration
  # when that is longer (four renewal intervals).
  echo $(( NODE_LEASE_S > 50 ? NODE_LEASE_S : 50 ))
}

start_kcm() {
  running_pid kube-controller-manager > /dev/null && return 0
  free_port kube-controller-manager "$KCM_PORT"
  local kc="$STATE/kubeconfigs/kube-controller-manager"
  mkdir -p "$STATE/kube-controller-manager"
  start_proc kube-controller-manager "$BIN/kube-controller-manager" \
    --kubeconfig "$kc" --authentication-kubeconfig "$kc" --authorization-kubeconfig "$kc" \
    --bind-address "$HOST" --secure-port "$KCM_PORT" \
    --cert-dir "$STATE/kube-controller-manager" \
    --leader-elect=false \
    --use-service-account-credentials=true \
    --service-account-private-key-file "$PKI/sa.key" \
    --root-ca-file "$PKI/ca.crt" \
    --cluster-signing-cert-file "$PKI/ca.crt" --cluster-signing-key-file "$PKI/ca.key" \
    --service-cluster-ip-range "$SERVICE_CIDR" \
    --controllers '*' \
    --node-monitor-grace-period "$(node_grace_s)s" \
    --profiling=false $(gates) \
    --v=1
  wait_until kube-controller-manager "kube-controller-manager /healthz" \
    curl -skf --max-time 2 "https://$HOST:$KCM_PORT/healthz"
  log "kube-controller-manager healthy on https://$HOST:$KCM_PORT"
}

start_scheduler() {
  running_pid kube-scheduler > /dev/null && return 0
  free_port kube-scheduler "$SCHEDULER_PORT"
  local kc="$STATE/kubeconfigs/kube-scheduler"
  mkdir -p "$STATE/kube-scheduler"
  start_proc kube-scheduler "$BIN/kube-scheduler" \
    --kubeconfig "$kc" --authentication-kubeconfig "$kc" --authorization-kubeconfig "$kc" \
    --bind-address "$HOST" --secure-port "$SCHEDULER_PORT" \
    --cert-dir "$STATE/kube-scheduler" \
    --leader-elect=false \
    --profiling=false $(gates) \
    --v=1
  wait_until kube-scheduler "kube-scheduler /healthz" \
    curl -skf --max-time 2 "https://$HOST:$SCHEDULER_PORT/healthz"
  log "kube-scheduler healthy on https://$HOST:$SCHEDULER_PORT"
}

start_kwok() {
  running_pid kwok > /dev/null && return 0
  free_port kwok "$KWOK_PORT"
  start_proc kwok "$BIN/kwok" \
    --config "$STATE/kwok.yaml" \
    --kubeconfig "$STATE/kubeconfigs/kwok" \
    --manage-nodes-with-annotation-selector kwok.x-k8s.io/node=fake \
    --server-address "$HOST:$KWOK_PORT" \
    --node-lease-duration-seconds "$NODE_LEASE_S"
  wait_until kwok "kwok /healthz" curl -sf --max-time 2 "http://$HOST:$KWOK_PORT/healthz"
  log "kwok healthy on http://$HOST:$KWOK_PORT (metrics at /metrics)"
}

# ------------------------------------------------------------- Prometheus --
prometheus_bin() {
  # The Prometheus built by build.sh; GPUEFF_PROMETHEUS_BIN runs another (e.g. Debian's, to compare).
  if [[ -n "${GPUEFF_PROMETHEUS_BIN:-}" ]]; then
    [[ -x "$GPUEFF_PROMETHEUS_BIN" ]] || die "GPUEFF_PROMETHEUS_BIN=$GPUEFF_PROMETHEUS_BIN is not executable"
    echo "$GPUEFF_PROMETHEUS_BIN"
    return 0
  fi
  bindir
  [[ -x "$BIN/prometheus" ]] || die "no prometheus in $BIN (run $HERE/build.sh)"
  echo "$BIN/prometheus"
}

write_prometheus_config() {
  mkdir -p "$PROM_DIR/targets" "$PROM_DIR/targets-operator" "$PROM_DIR/data"
  cat > "$PROM_DIR/prometheus.yml.tmp" << EOF
# Generated by hack/localcluster/cluster.sh; edit the script, not this file.
global:
  scrape_interval: $PROM_SCRAPE_INTERVAL
  scrape_timeout: $PROM_SCRAPE_INTERVAL
  evaluation_interval: 1s
scrape_configs:
  - job_name: dcgm
    honor_labels: true
    file_sd_configs:
      - files: ['$PROM_DIR/targets/*.json']
        refresh_interval: 1s
    # The simulator and the node agents run on this host for every fake node (no pod network):
    # each series of a target registered as node-local gets the instance its node's own exporter
    # would have (a hostNetwork DaemonSet pod, scraped at its node's address): <node>:9400, the node
    # named by the first node label the exporter generation writes. The operator believes a GPU
    # only from a scrape target on its node (safety rule 9).
    metric_relabel_configs:
      - source_labels: [gpueff_node_local, Hostname, hostname, kubernetes_node, node, nodename]
        regex: 'true;+([^;]+).*'
        target_label: instance
        replacement: '\${1}:9400'
      - regex: gpueff_node_local
        action: labeldrop
  - job_name: gpu-efficiency-operator
    honor_labels: true
    file_sd_configs:
      - files: ['$PROM_DIR/targets-operator/*.json']
        refresh_interval: 1s
EOF
  mv "$PROM_DIR/prometheus.yml.tmp" "$PROM_DIR/prometheus.yml"
}

start_prometheus() {
  running_pid prometheus > /dev/null && return 0
  local prometheus
  prometheus="$(prometheus_bin)"
  write_prometheus_config
  free_port prometheus "$PROM_PORT"
  start_proc prometheus "$prometheus" \
    --config.file "$PROM_DIR/prometheus.yml" \
    --storage.tsdb.path "$PROM_DIR/data" \
    --storage.tsdb.retention.time "$PROM_RETENTION" \
    --web.listen-address "$HOST:$PROM_PORT" \
    --web.enable-lifecycle \
    --log.level warn
  wait_until prometheus "prometheus /-/ready" curl -sf --max-time 2 "http://$HOST:$PROM_PORT/-/ready"
  log "prometheus ready on http://$HOST:$PROM_PORT (targets: $PROM_DIR/targets/*.json)"
}

# ---------------------------------------------------------- VictoriaMetrics --
VM_BIN=""
vm_bindir() {
  [[ -n "$VM_BIN" ]] && return 0
  VM_BIN="${GPUEFF_VM_BIN:-$("$HERE/build-victoriametrics.sh" | tail -n 1)}"
  [[ -x "$VM_BIN/victoria-metrics" ]] || die "no victoria-metrics in $VM_BIN (run $HERE/build-victoriametrics.sh)"
}
# The cluster version is not served by the Go module proxy (only `-cluster` tags carry its programs):
# GPUEFF_VM_CLUSTER_BIN names a directory with vminsert, vmselect and vmstorage built elsewhere.
vm_cluster_bindir() {
  local b
  [[ -n "${GPUEFF_VM_CLUSTER_BIN:-}" ]] || die "victoriametrics-cluster needs GPUEFF_VM_CLUSTER_BIN: a directory" \
    "with vminsert, vmselect and vmstorage (VictoriaMetrics' cluster version; its -cluster tags are not" \
    "served by the Go module proxy, so build-victoriametrics.sh cannot build them; see README.md)"
  for b in vminsert vmselect vmstorage; do
    [[ -x "$GPUEFF_VM_CLUSTER_BIN/$b" ]] || die "GPUEFF_VM_CLUSTER_BIN=$GPUEFF_VM_CLUSTER_BIN has no executable $b"
  done
}
# running_pid knows our processes by their name and the state dir in their command line: the cluster
# binaries run through links in the state dir (vminsert's flags name no path of ours).
vm_cluster_link() { # BINARY NAME -> path of a link named NAME to BINARY
  mkdir -p "$VM_DIR/bin"
  ln -sfn "$GPUEFF_VM_CLUSTER_BIN/$1" "$VM_DIR/bin/$2"
  echo "$VM_DIR/bin/$2"
}
# The backend this state dir was brought up with (up --metrics), prometheus when never said.
metrics_backend() { cat "$STATE/metrics" 2> /dev/null || echo prometheus; }
vm_url() {
  case "${1:-$(metrics_backend)}" in
    victoriametrics) echo "http://$HOST:$VM_PORT" ;;
    victoriametrics-cluster) echo "http://$HOST:$VMSELECT_PORT/select/0/prometheus" ;;
    *) echo "http://$HOST:$PROM_PORT" ;;
  esac
}
vm_flags() { # shared by single-node and vmselect
  echo "-loggerLevel=WARN"
  echo "-search.latencyOffset=$VM_LATENCY_OFFSET"
  if [[ -n "${GPUEFF_VM_SEARCH_FLAGS:-}" ]]; then
    # shellcheck disable=SC2086 # one flag a word
    printf '%s\n' $GPUEFF_VM_SEARCH_FLAGS
  fi
}
vm_scrape_flags() { # the Prometheus scrape config, file-SD re-read as often as Prometheus does
  echo "-promscrape.config=$PROM_DIR/prometheus.yml"
  echo "-promscrape.config.strictParse=false"
  echo "-promscrape.fileSDCheckInterval=1s"
}
start_victoriametrics() {
  running_pid victoria-metrics > /dev/null && return 0
  vm_bindir
  write_prometheus_config
  mkdir -p "$VM_DIR/single"
  free_port victoria-metrics "$VM_PORT"
  # shellcheck disable=SC2046
  start_proc victoria-metrics "$VM_BIN/victoria-metrics" $(vm_flags) $(vm_scrape_flags) \
    -storageDataPath="$VM_DIR/single" -retentionPeriod=1d -httpListenAddr="$HOST:$VM_PORT"
  wait_until victoria-metrics "victoria-metrics /health" curl -sf --max-time 2 "http://$HOST:$VM_PORT/health"
  log "victoria-metrics ready on $(vm_url victoriametrics) (targets: $PROM_DIR/targets/*.json)"
}
vmstorage_ports() { # N -> http vminsert vmselect
  local b=$((VMSTORAGE_PORT_BASE + 10 * $1))
  echo "$b $((b + 1)) $((b + 2))"
}
start_vmstorage() {
  local n=$1 http ins sel
  running_pid "vmstorage-$n" > /dev/null && return 0
  read -r http ins sel <<< "$(vmstorage_ports "$n")"
  mkdir -p "$VM_DIR/vmstorage-$n"
  free_port "vmstorage-$n" "$http"
  # shellcheck disable=SC2046
  start_proc "vmstorage-$n" "$(vm_cluster_link vmstorage "vmstorage-$n")" -loggerLevel=WARN \
    -storageDataPath="$VM_DIR/vmstorage-$n" -retentionPeriod=1d -httpListenAddr="$HOST:$http" \
    -vminsertAddr="$HOST:$ins" -vmselectAddr="$HOST:$sel"
  wait_until "vmstorage-$n" "vmstorage-$n /health" curl -sf --max-time 2 "http://$HOST:$http/health"
}
start_victoriametrics_cluster() {
  vm_bindir
  vm_cluster_bindir
  write_prometheus_config
  local n ins=() sel=() http i s
  for n in 1 2; do
    start_vmstorage "$n"
    read -r http i s <<< "$(vmstorage_ports "$n")"
    ins+=("$HOST:$i"); sel+=("$HOST:$s")
  done
  local insert_nodes select_nodes
  insert_nodes=$(IFS=,; echo "${ins[*]}"); select_nodes=$(IFS=,; echo "${sel[*]}")
  if ! running_pid vminsert > /dev/null; then
    free_port vminsert "$VMINSERT_PORT"
    start_proc vminsert "$(vm_cluster_link vminsert vminsert)" -loggerLevel=WARN \
      -storageNode="$insert_nodes" -httpListenAddr="$HOST:$VMINSERT_PORT"
    wait_until vminsert "vminsert /health" curl -sf --max-time 2 "http://$HOST:$VMINSERT_PORT/health"
  fi
  if ! running_pid vmselect > /dev/null; then
    free_port vmselect "$VMSELECT_PORT"
    # shellcheck disable=SC2046
    start_proc vmselect "$(vm_cluster_link vmselect vmselect)" $(vm_flags) -cacheDataPath="$VM_DIR/vmselect-cache" \
      -storageNode="$select_nodes" -httpListenAddr="$HOST:$VMSELECT_PORT"
    wait_until vmselect "vmselect /health" curl -sf --max-time 2 "http://$HOST:$VMSELECT_PORT/health"
  fi
  if ! running_pid vmagent > /dev/null; then
    mkdir -p "$VM_DIR/vmagent"
    free_port vmagent "$VMAGENT_PORT"
    # shellcheck disable=SC2046
    start_proc vmagent "$VM_BIN/vmagent" -loggerLevel=WARN $(vm_scrape_flags) \
      -remoteWrite.url="http://$HOST:$VMINSERT_PORT/insert/0/prometheus/api/v1/write" \
      -remoteWrite.tmpDataPath="$VM_DIR/vmagent" -remoteWrite.flushInterval=200ms \
      -httpListenAddr="$HOST:$VMAGENT_PORT"
    wait_until vmagent "vmagent /health" curl -sf --max-time 2 "http://$HOST:$VMAGENT_PORT/health"
  fi
  log "victoriametrics-cluster ready on $(vm_url victoriametrics-cluster) (targets: $PROM_DIR/targets/*.json)"
}
VM_COMPONENTS=(victoria-metrics vmagent vmselect vminsert vmstorage-1 vmstorage-2)
stop_victoriametrics() { local c; for c in "${VM_COMPONENTS[@]}"; do stop_proc "$c"; done; }
# The metrics backend of `up`: Prometheus (the default) or VictoriaMetrics, single-node or cluster.
start_metrics() {
  case "$(metrics_backend)" in
    prometheus) start_prometheus ;;
    victoriametrics) start_victoriametrics ;;
    victoriametrics-cluster) start_victoriametrics_cluster ;;
  esac
}
metrics_components() {
  case "$(metrics_backend)" in
    prometheus) echo prometheus ;;
    victoriametrics) echo victoria-metrics ;;
    victoriametrics-cluster) echo vmagent vmselect vminsert vmstorage-1 vmstorage-2 ;;
  esac
}

# -------------------------------------------------------------- readiness --
pdb_status_works() {
  local ns=default name=gpueff-localcluster-pdb-probe gen
  kubectl_ apply -f - > /dev/null << EOF
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata: {name: $name, namespace: $ns}
spec:
  minAvailable: 1
  selector: {matchLabels: {gpueff.localcluster/pdb-probe: "none"}}
EOF
  local deadline=$((SECONDS + WAIT_TIMEOUT))
  while :; do
    gen="$(kubectl_ -n $ns get pdb $name -o 'jsonpath={.status.observedGeneration}' 2> /dev/null || true)"
    [[ -n "$gen" && "$gen" != 0 ]] && break
    ((SECONDS < deadline)) || fail_with_log kube-controller-manager "PDB status was never computed (disruption controller)"
    sleep 0.3
  done
  kubectl_ -n $ns delete pdb $name --wait=false > /dev/null
}

wait_cluster_ready() {
  wait_until kube-controller-manager "the default ServiceAccount in namespace default" \
    kubectl_ -n default get serviceaccount default
  pdb_status_works
}

# ------------------------------------------------------------------ nodes --
# The fake GPU nodes come from the harness's GPU catalogue (gpu-efficiency-sim node-manifests), so
# their labels match what the simulator serves. GPUEFF_PYTHON picks the interpreter (default: the
# repo's .venv, which `make` creates before the cluster, else python3); this checkout's packages come
# first on PYTHONPATH.
sim() {
  local py="${GPUEFF_PYTHON:-}"
  if [[ -z "$py" ]]; then
    if [[ -x "$ROOT/.venv/bin/python" ]]; then py="$ROOT/.venv/bin/python"; else py=python3; fi
  fi
  PYTHONPATH="$ROOT/operator:$ROOT/harness${PYTHONPATH:+:$PYTHONPATH}" "$py" -m gpu_efficiency_sim "$@"
}

cmd_add_nodes() {
  local n="" gpus=$DEFAULT_GPUS models=() prefix=$DEFAULT_PREFIX
  while (($#)); do
    case "$1" in
      --gpus) gpus=$2; shift 2 ;;
      --models) models=(--models "$2"); shift 2 ;;
      --prefix) prefix=$2; shift 2 ;;
      -*) die "add-nodes: unknown flag $1" ;;
      *) n=$1; shift ;;
    esac
  done
  [[ "$n" =~ ^[0-9]+$ ]] || die "usage: cluster.sh add-nodes N [--gpus 8] [--models M1,M2] [--prefix gpu-node-]"
  ((n > 0)) || return 0
  # next free index for this prefix
  local next=0 name idx
  while read -r name; do
    idx=${name#"$prefix"}
    [[ "$name" == "$prefix"* && "$idx" =~ ^[0-9]+$ ]] && ((idx >= next)) && next=$((idx + 1))
  done < <(kubectl_ get nodes -o 'jsonpath={range .items[*]}{.metadata.name}{"\n"}{end}')
  local i manifest names=()
  for ((i = 0; i < n; i++)); do names+=("$prefix$((next + i))"); done
  manifest="$(sim node-manifests "$n" --first "$next" --prefix "$prefix" --gpus "$gpus" "${models[@]}")" \
    || die "add-nodes: gpu-efficiency-sim node-manifests failed (GPUEFF_PYTHON=${GPUEFF_PYTHON:-})"
  printf '%s' "$manifest" | kubectl_ create -f - > /dev/null
  local deadline=$((SECONDS + WAIT_TIMEOUT))
  for name in "${names[@]}"; do
    until [[ "$(kubectl_ get node "$name" -o 'jsonpath={.status.conditions[?(@.type=="Ready")].status}' 2> /dev/null)" == True ]]; do
      running_pid kwok > /dev/null || fail_with_log kwok "kwok is not running; node $name cannot become Ready"
      ((SECONDS < deadline)) || fail_with_log kwok "node $name did not become Ready"
      sleep 0.3
    done
  done
  log "added ${#names[@]} fake GPU node(s): ${names[*]}"
}

cmd_delete_nodes() {
  local prefix=${1:-}
  [[ -n "$prefix" ]] || die "usage: cluster.sh delete-nodes PREFIX"
  local names
  names="$(kubectl_ get nodes -o 'jsonpath={range .items[*]}{.metadata.name}{"\n"}{end}' | grep "^$prefix" || true)"
  [[ -z "$names" ]] && { log "no nodes with prefix $prefix"; return 0; }
  # shellcheck disable=SC2086
  kubectl_ delete node $names > /dev/null
  log "deleted nodes: $(echo $names)"
}

count_nodes() { kubectl_ get nodes -o 'jsonpath={range .items[*]}{.metadata.name}{"\n"}{end}' | grep -c "^$1" || true; }

# --------------------------------------------------------------- commands --
all_running() {
  local c
  for c in "${COMPONENTS[@]}"; do running_pid "$c" > /dev/null || return 1; done
}

cmd_up() {
  local nodes=$DEFAULT_NODES metrics=prometheus
  while (($#)); do
    case "$1" in
      --nodes) nodes=$2; shift 2 ;;
      --nodes=*) nodes=${1#--nodes=}; shift ;;
      --metrics) metrics=$2; shift 2 ;;
      --metrics=*) metrics=${1#--metrics=}; shift ;;
      *) die "up: unknown argument $1" ;;
    esac
  done
  case "$metrics" in
    prometheus | victoriametrics | victoriametrics-cluster) ;;
    *) die "up: --metrics must be prometheus, victoriametrics or victoriametrics-cluster, got '$metrics'" ;;
  esac
  [[ "$metrics" == victoriametrics-cluster ]] && vm_cluster_bindir
  check_settings
  mkdir -p "$STATE"
  echo "$metrics" > "$STATE/metrics"
  COMPONENTS=("${CONTROL_PLANE[@]}" $(metrics_components))
  if all_running && curl_k "https://$HOST:$APISERVER_PORT/readyz" > /dev/null 2>&1; then
    log "already up"
    cmd_status
    return 0
  fi
  local t0=$SECONDS
  bindir
  gen_pki
  write_configs
  start_etcd
  start_apiserver
  start_kcm
  start_scheduler
  start_kwok
  start_metrics
  wait_cluster_ready
  local have
  have=$(count_nodes "$DEFAULT_PREFIX")
  ((have < nodes)) && cmd_add_nodes $((nodes - have))
  log "cluster up in $((SECONDS - t0))s"
  cmd_env
}

cmd_down() {
  local purge=0
  [[ "${1:-}" == --purge ]] && purge=1
  local i
  stop_victoriametrics
  stop_proc prometheus
  for ((i = ${#CONTROL_PLANE[@]} - 1; i >= 0; i--)); do stop_proc "${CONTROL_PLANE[$i]}"; done
  if ((purge)); then
    rm -rf "$STATE"
    log "purged $STATE"
  fi
}

cmd_status() {
  local c pid rc=0
  for c in "${COMPONENTS[@]}"; do
    if pid="$(running_pid "$c")"; then
      printf '%-24s running (pid %s)\n' "$c" "$pid"
    else
      printf '%-24s stopped\n' "$c"; rc=1
    fi
  done
  if curl_k "https://$HOST:$APISERVER_PORT/readyz" > /dev/null 2>&1; then
    echo "apiserver:  https://$HOST:$APISERVER_PORT (ready)"
    kubectl_ get nodes -L nvidia.com/gpu.product --no-headers 2> /dev/null | sed 's/^/node: /' || true
  fi
  echo "metrics:    $(metrics_backend) $(vm_url)"
  echo "kubeconfig: $KUBECONFIG_FILE"
  return $rc
}

cmd_env() {
  echo "export KUBECONFIG=$KUBECONFIG_FILE"
  echo "export GPUEFF_PROMETHEUS_URL=$(vm_url)"
  echo "export GPUEFF_METRICS_BACKEND=$(metrics_backend)"
  echo "export GPUEFF_PROMETHEUS_TARGETS_DIR=$PROM_DIR/targets"
  echo "export GPUEFF_PROMETHEUS_OPERATOR_TARGETS_DIR=$PROM_DIR/targets-operator"
  echo "export GPUEFF_LOCALCLUSTER_STATE=$STATE"
  echo "export GPUEFF_LOCALCLUSTER_BIN=${GPUEFF_LOCALCLUSTER_BIN:-$("$HERE/build.sh" --print-bindir)}"
}

cmd_logs() {
  local follow=0 names=()
  for a in "$@"; do
    case "$a" in -f | --follow) follow=1 ;; *) names+=("$a") ;; esac
  done
  ((${#names[@]})) || names=("${COMPONENTS[@]}")
  local files=() n
  for n in "${names[@]}"; do [[ -f "$LOGS/$n.log" ]] && files+=("$LOGS/$n.log"); done
  ((${#files[@]})) || die "no logs under $LOGS"
  if ((follow)); then tail -n 50 -F "${files[@]}"; else tail -n 50 "${files[@]}"; fi
}

# Serialise state-changing verbs (parallel test workers may all call `up`).
lock_state() {
  mkdir -p "$STATE"
  exec 8> "$STATE/.lock"
  flock -w "$WAIT_TIMEOUT" 8 || die "another cluster.sh holds $STATE/.lock"
}

main() {
  local verb=${1:-}
  (($#)) && shift
  case "$verb" in up | down | prometheus-up | prometheus-down | victoriametrics-* | vmstorage-*) lock_state ;; esac
  COMPONENTS=("${CONTROL_PLANE[@]}" $(metrics_components))
  case "$verb" in
    up) cmd_up "$@" ;;
    down) cmd_down "$@" ;;
    status) cmd_status ;;
    env) cmd_env ;;
    logs) cmd_logs "$@" ;;
    add-nodes) cmd_add_nodes "$@" ;;
    delete-nodes) cmd_delete_nodes "$@" ;;
    prometheus-up) start_prometheus ;;
    prometheus-down) stop_proc prometheus ;;
    victoriametrics-up) # beside the recorded backend: the e2e matrix plays the same cluster on it
      case "${1:-}" in
        --cluster) start_victoriametrics_cluster; vm_url victoriametrics-cluster ;;
        "") start_victoriametrics; vm_url victoriametrics ;;
        *) die "victoriametrics-up: unknown argument $1" ;;
      esac ;;
    victoriametrics-down) stop_victoriametrics ;;
    vmstorage-down) [[ "${1:-}" =~ ^[12]$ ]] || die "vmstorage-down: N must be 1 or 2"; stop_proc "vmstorage-$1" ;;
    vmstorage-up) [[ "${1:-}" =~ ^[12]$ ]] || die "vmstorage-up: N must be 1 or 2"; vm_cluster_bindir; start_vmstorage "$1" ;;
    kubectl) kubectl_ "$@" ;;
    *) sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2 ;;
  esac
}

main "$@"
