#!/usr/bin/env bash
# Build VictoriaMetrics (single-node `victoria-metrics`, and `vmagent`) from the pinned Go module in
# ./victoriametrics, into its own cache beside build.sh's:
#
#   ${GPUEFF_CACHE_DIR:-$HOME/.cache/gpu-efficiency-operator}/victoriametrics/<key>/bin
#
# A separate step with its own key (go.mod/go.sum/tools.go of ./victoriametrics, this script, the Go
# version), so pinning or bumping VictoriaMetrics does not rebuild Kubernetes and Prometheus, and
# build.sh's cache stays valid. cluster.sh calls it only for `--metrics victoriametrics*`.
#
# The cluster version (vminsert, vmselect, vmstorage) is published only under `vX.Y.Z-cluster` tags,
# which the Go module proxy does not serve; in this module app/vminsert, app/vmselect and
# app/vmstorage are the single-node server's library packages, not programs. Give cluster binaries
# built elsewhere with GPUEFF_VM_CLUSTER_BIN (see README.md).
#
# Usage: build-victoriametrics.sh                build (or reuse); last stdout line = bin dir
#        build-victoriametrics.sh --print-bindir print the bin dir for the current key, build nothing
#        build-victoriametrics.sh --force        rebuild even if cached
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
MOD="$HERE/victoriametrics"
CACHE_ROOT="${GPUEFF_CACHE_DIR:-$HOME/.cache/gpu-efficiency-operator}/victoriametrics"
VM_VERSION=v1.151.0   # must match the pin in victoriametrics/go.mod

key() {
  (
    cd "$HERE"
    sha256sum victoriametrics/go.mod victoriametrics/go.sum victoriametrics/tools.go build-victoriametrics.sh
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

want=(victoria-metrics vmagent)
complete() { for b in "${want[@]}"; do [[ -x "$BINDIR/$b" ]] || return 1; done; }

if [[ "$FORCE" == 0 ]] && complete; then
  echo "cached: $BINDIR" >&2
  echo "$BINDIR"
  exit 0
fi

mkdir -p "$CACHE_ROOT"
exec 9>"$CACHE_ROOT/.build.lock"
flock 9
if [[ "$FORCE" == 0 ]] && complete; then
  echo "cached (built concurrently): $BINDIR" >&2
  echo "$BINDIR"
  exit 0
fi

start=$(date +%s)
TMP="$(mktemp -d "$CACHE_ROOT/.tmp-$KEY-XXXXXX")"
trap 'rm -rf "$TMP"' EXIT
chmod 755 "$TMP"
mkdir -p "$TMP/bin"

# Pure Go, as VictoriaMetrics' own `*-pure` make targets (zstd without cgo).
export CGO_ENABLED=0
export GOFLAGS="-mod=readonly -buildvcs=false"
stamp="-X github.com/VictoriaMetrics/VictoriaMetrics/lib/buildinfo.Version"
for c in "${want[@]}"; do
  t0=$(date +%s)
  echo ">> [victoriametrics] go build app/$c -> $c" >&2
  (cd "$MOD" && go build -p 2 -trimpath -ldflags "-s -w $stamp=$c-$VM_VERSION" \
     -o "$TMP/bin/$c" "github.com/VictoriaMetrics/VictoriaMetrics/app/$c")
  echo "   [victoriametrics] $c done in $(( $(date +%s) - t0 ))s" >&2
done

printf 'victoriametrics %s\ngo %s\nkey %s\n' "$VM_VERSION" "$(go env GOVERSION)" "$KEY" > "$TMP/VERSIONS"

rm -rf "$DEST.old"
[[ -d "$DEST" ]] && mv "$DEST" "$DEST.old"
mv "$TMP" "$DEST"
trap - EXIT
rm -rf "$DEST.old"
for d in "$CACHE_ROOT"/*/; do
  [[ "${d%/}" != "$DEST" && -f "$d/VERSIONS" ]] && rm -rf "${d%/}"
done
echo "built in $(( $(date +%s) - start ))s: $BINDIR" >&2
echo "$BINDIR"
