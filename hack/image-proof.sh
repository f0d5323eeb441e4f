#!/usr/bin/env bash
# Builds the Dockerfile for real with buildah (chroot isolation, vfs storage: no daemon, no registry)
# and runs the image as its own non-root user: `make image-proof`.
#
# Why a home-made base: this machine reaches package registries (Debian, PyPI) but no container
# registry, so python:3.11-slim-bookworm cannot be pulled. The base is Debian bookworm made by
# debootstrap with Debian's python3 (3.11), pip and venv, imported as a local image and passed as
# PYTHON_IMAGE; every step of the Dockerfile then runs unchanged: the wheel, the --require-hashes
# install from requirements.lock, the non-root runtime stage. Where TLS goes through an intercepting
# proxy, the host's CA bundle is copied into the base (a property of this machine, not of the image).
#
# Needs root, debootstrap and buildah (Debian packages; installed when missing). The base is cached
# under $CACHE and the build steps in buildah's layer cache (a changed input rebuilds from there):
# about 10 minutes the first time on a machine (debootstrap, then the pip install), about 40 s warm,
# which is why `make test` runs it.
set -euo pipefail
cd "$(dirname "$0")/.."

CACHE=${GPUEFF_IMAGE_PROOF_CACHE:-$HOME/.cache/gpu-efficiency-operator/image-proof}
BASE=localhost/gpueff-proof-base:bookworm
IMAGE=localhost/gpu-efficiency-operator:proof
UID_GID=65532:65532
export STORAGE_DRIVER=vfs BUILDAH_ISOLATION=chroot

need() { command -v "$1" >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$2" >/dev/null; }; }
need debootstrap debootstrap
need buildah buildah

if ! buildah images -q "$BASE" 2>/dev/null | grep -q .; then
  mkdir -p "$CACHE"
  if [ ! -f "$CACHE/base.tar" ]; then
    rm -rf "$CACHE/rootfs"
    echo "== debootstrap bookworm with python3 (a few minutes, once)"
    debootstrap --variant=minbase --include=python3,python3-venv,python3-pip,python-is-python3,ca-certificates \
      bookworm "$CACHE/rootfs" http://deb.debian.org/debian >"$CACHE/debootstrap.log"
    rm -rf "$CACHE/rootfs/var/cache/apt/archives/"*.deb "$CACHE/rootfs/var/lib/apt/lists/"*
    tar -C "$CACHE/rootfs" -cf "$CACHE/base.tar" --exclude=./proc --exclude=./sys --exclude=./dev .
    rm -rf "$CACHE/rootfs"
  fi
  echo "== import the base as $BASE"
  ctr=$(buildah from scratch)
  buildah add "$ctr" "$CACHE/base.tar" / >/dev/null
  buildah copy "$ctr" /etc/ssl/certs/ca-certificates.crt /etc/ssl/certs/ca-certificates.crt >/dev/null
  buildah config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin "$ctr"
  buildah commit -q "$ctr" "$BASE" >/dev/null
  buildah rm "$ctr" >/dev/null
fi

echo "== buildah bud (the Dockerfile, unchanged, FROM $BASE)"
start=$(date +%s)
buildah bud --layers --isolation chroot --build-arg "PYTHON_IMAGE=$BASE" -t "$IMAGE" . >"$CACHE/bud.log" 2>&1 \
  || { tail -40 "$CACHE/bud.log"; echo "image-proof: the build failed (log: $CACHE/bud.log)"; exit 1; }
echo "   built in $(( $(date +%s) - start )) s; --require-hashes install: $(grep -c -- '--require-hashes' "$CACHE/bud.log") step"

ctr=$(buildah from "$IMAGE")
trap 'buildah rm "$ctr" >/dev/null 2>&1 || true' EXIT
user=$(buildah inspect --format '{{.OCIv1.Config.User}}' "$IMAGE")
[ "$user" = "$UID_GID" ] || { echo "image-proof: the image's USER is '$user', not $UID_GID"; exit 1; }
echo "== as the image's user ($user):"
uid=$(buildah run --user "$UID_GID" "$ctr" -- id -u)
[ "$uid" = "${UID_GID%%:*}" ] || { echo "image-proof: runs as uid '$uid'"; exit 1; }
echo "uid $uid"
buildah run --user "$UID_GID" "$ctr" -- gpu-efficiency --version
buildah run --user "$UID_GID" "$ctr" -- gpu-efficiency agent --help | head -1
buildah run --user "$UID_GID" "$ctr" -- gpu-efficiency run --help | head -1
# Read-only friendly: the user cannot write the installed code, and nothing needs to.
if buildah run --user "$UID_GID" "$ctr" -- sh -c 'touch /opt/venv/probe' 2>/dev/null; then
  echo "image-proof: uid 65532 can write /opt/venv"; exit 1
fi
venv=$(buildah run "$ctr" -- du -sm /opt/venv | cut -f1)
echo "== sizes: image $(buildah images --format '{{.Size}}' "$IMAGE"), base $(buildah images --format '{{.Size}}' "$BASE"), /opt/venv ${venv} MB"
echo "   (on python:3.11-slim-bookworm the image is that base plus the same /opt/venv layer)"
# arm64 (Grace) is not built here, but the lock can be checked: every locked file must exist as an
# aarch64 (or pure-Python) wheel whose sha256 is in the lock, as the image's pip would demand.
echo "== requirements.lock for linux/arm64 (pip download, hashes checked; nothing is run)"
arm=$(mktemp -d)
python3 -m pip download -q --no-deps --implementation cp --python-version 3.11 --only-binary=:all: \
  --platform manylinux2014_aarch64 --platform manylinux_2_17_aarch64 --platform manylinux_2_28_aarch64 \
  --require-hashes -r requirements.lock -d "$arm" >/dev/null
echo "   $(ls "$arm" | wc -l) of $(grep -cE '^[a-z]' requirements.lock) locked packages resolve ($(ls "$arm" | grep -c aarch64) native aarch64 wheels)"
rm -rf "$arm"
echo "image-proof: OK"
