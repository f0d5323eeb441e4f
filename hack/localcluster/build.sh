#!/usr/bin/env bash
# Build the local-cluster binaries (kube-apiserver, kube-controller-manager,
# kube-scheduler, kubectl, etcd, kwok, helm, prometheus, promtool) from the pinned Go modules in this
# directory, into a cache outside the repository:
#
#   ${GPUEFF_CACHE_DIR:-$HOME/.cache/gpu-efficiency-operator}/localcluster/<key>/bin
#
# <key> is a hash of the go.mod/go.sum files and this script, so changing a pin
# rebuilds, and an unchanged tree reuses the cached binaries ("cached").
#
# Usage: build.sh              build (or reuse) and print the bin dir on the last line
#        build.sh --print-bindir  print the bin dir for the current key, build nothing
#        build.sh --force      rebuild even if cached
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
CACHE_ROOT="${GPUEFF_CACHE_DIR:-$HOME/.cache/gpu-efficiency-operator}/localcluster"
MODULES=(kubernetes etcd kwok helm prometheus)

# Versions stamped into the binaries (must match the pins in the go.mod files).
KUBE_VERSION=v1.36.3
KUBE_CLIENT_VERSION=v0.36.3
ETCD_VERSION=v3.6.16
KWOK_VERSION=v0.8.0
HELM_VERSION=v3.22.0
PROMETHEUS_VERSION=v3.10.0   # module github.com/prometheus/prometheus v0.310.0
# Fixed so builds are reproducible; the release dates of the pinned versions.
KUBE_BUILD_DATE=2026-07-22T18:07:38Z

key() {
  (
    cd "$HERE"
    for m in "${MODULES[@]}"; do sha256sum "$m/go.mod" "$m/go.sum" "$m/tools.go"; done
    sha256sum build.sh
    go env GOVERSION GOOS GOARCH
  ) | sha256sum | cut -c1-16
}

KEY="$(key)"
DEST="$CACHE_ROOT/$KEY"
BINDIR="$DEST/bin"

case "${1:-}" in
  --print-bindir) echo "$BINDIR"; exit 0 ;;
  --force) FORCE=1 ;;
  "") FORCE=0 ;;
  *) echo "usage: $0 [--print-bindir|--force]" >&2; exit 2 ;;
esac

want=(kube-apiserver kube-controller-manager kube-scheduler kubectl etcd kwok helm prometheus promtool)
complete() { for b in "${want[@]}"; do [[ -x "$BINDIR/$b" ]] || return 1; done; }

if [[ "$FORCE" == 0 ]] && complete; then
  echo "cached: $BINDIR" >&2
  echo "$BINDIR"
  exit 0
fi

mkdir -p "$CACHE_ROOT"
# One build at a time per cache (parallel test runs may call us concurrently).
exec 9>"$CACHE_ROOT/.build.lock"
flock 9
if [[ "$FORCE" == 0 ]] && complete; then
  echo "cached (built concurrently): $BINDIR" >&2
  echo "$BINDIR"
  exit 0
fi

GOCACHE_DIR="$(go env GOCACHE)"
GOMODCACHE_DIR="$(go env GOMODCACHE)"
du_mb() { if [[ -d "$1" ]]; then du -sm "$1" 2>/dev/null | cut -f1; else echo 0; fi; }
gocache_before=$(du_mb "$GOCACHE_DIR")
modcache_before=$(du_mb "$GOMODCACHE_DIR")
start=$(date +%s)

TMP="$(mktemp -d "$CACHE_ROOT/.tmp-$KEY-XXXXXX")"
trap 'rm -rf "$TMP"' EXIT
chmod 755 "$TMP"
mkdir -p "$TMP/bin"

export CGO_ENABLED=0
export GOFLAGS="-mod=readonly -buildvcs=false"
common=(-p 2 -trimpath)

gobuild() { # module out pkg ldflags [go build flags...]
  local mod=$1 out=$2 pkg=$3 ld=$4 t0
  shift 4
  t0=$(date +%s)
  echo ">> [$mod] go build $pkg -> $out" >&2
  (cd "$HERE/$mod" && go build "${common[@]}" "$@" -ldflags "-s -w $ld" -o "$TMP/bin/$out" "$pkg")
  echo "   [$mod] $out done in $(( $(date +%s) - t0 ))s" >&2
}

# --- Kubernetes ---------------------------------------------------------------
maj=${KUBE_VERSION#v}; maj=${maj%%.*}
min=${KUBE_VERSION#v$maj.}; min=${min%%.*}
kv=""
for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  kv+=" -X $p.gitVersion=$KUBE_VERSION -X $p.gitMajor=$maj -X $p.gitMinor=$min"
  kv+=" -X $p.gitCommit=0000000000000000000000000000000000000000 -X $p.gitTreeState=clean"
  kv+=" -X $p.buildDate=$KUBE_BUILD_DATE"
done
for c in kube-apiserver kube-controller-manager kube-scheduler kubectl; do
  gobuild kubernetes "$c" "k8s.io/kubernetes/cmd/$c" "$kv"
done

# --- etcd (the server module's root package is the etcd main package) --------
gobuild etcd etcd go.etcd.io/etcd/server/v3 ""

# --- KWOK controller (kwokctl is not needed: it downloads things) ------------
gobuild kwok kwok sigs.k8s.io/kwok/cmd/kwok "-X sigs.k8s.io/kwok/pkg/consts.Version=${KWOK_VERSION#v}"

# --- helm ---------------------------------------------------------------------
# Like helm's Makefile: the default Capabilities.KubeVersion is client-go's minor + 1.x.
cg="$(cd "$HERE/helm" && go list -f '{{.Version}}' -m k8s.io/client-go)"   # v0.MINOR.PATCH
cg="${cg#v}"; hk_major=$(( ${cg%%.*} + 1 )); hk_minor="${cg#*.}"; hk_minor="${hk_minor%%.*}"
hv="helm.sh/helm/v3"
gobuild helm helm helm.sh/helm/v3/cmd/helm \
  "-X $hv/internal/version.version=$HELM_VERSION -X $hv/internal/version.gitTreeState=clean \
   -X $hv/pkg/lint/rules.k8sVersionMajor=$hk_major -X $hv/pkg/lint/rules.k8sVersionMinor=$hk_minor \
   -X $hv/pkg/chartutil.k8sVersionMajor=$hk_major -X $hv/pkg/chartutil.k8sVersionMinor=$hk_minor"

# --- Prometheus and promtool ----------------------------------------------------
# A current Prometheus (Debian's is 2.42, from 2023). Only file and static discovery are used.
pv="github.com/prometheus/common/version"
for c in prometheus promtool; do
  gobuild prometheus "$c" "github.com/prometheus/prometheus/cmd/$c" \
    "-X $pv.Version=${PROMETHEUS_VERSION#v} -X $pv.Branch=release" \
    -tags remove_all_sd
done

cat > "$TMP/VERSIONS" <<EOF
kubernetes $KUBE_VERSION (staging $KUBE_CLIENT_VERSION)
etcd $ETCD_VERSION
kwok $KWOK_VERSION
helm $HELM_VERSION
prometheus $PROMETHEUS_VERSION
go $(go env GOVERSION)
key $KEY
EOF

# Atomic publish: rename the finished temp dir into place.
rm -rf "$DEST.old"
[[ -d "$DEST" ]] && mv "$DEST" "$DEST.old"
mv "$TMP" "$DEST"
trap - EXIT
rm -rf "$DEST.old"
# Drop binaries of other (older) pins; running processes keep their open inodes.
for d in "$CACHE_ROOT"/*/; do
  [[ "${d%/}" != "$DEST" && -f "$d/VERSIONS" ]] && rm -rf "${d%/}"
done

end=$(date +%s)
echo "built in $(( end - start ))s: $BINDIR" >&2
echo "disk: bin $(du_mb "$BINDIR") MB; GOCACHE +$(( $(du_mb "$GOCACHE_DIR") - gocache_before )) MB ($GOCACHE_DIR);" \
     "GOMODCACHE +$(( $(du_mb "$GOMODCACHE_DIR") - modcache_before )) MB ($GOMODCACHE_DIR)" >&2
echo "$BINDIR"
