#!/usr/bin/env bash
# Build the sglang-rq images from this checkout, with or without access to Docker Hub.
#
#   docker/build.sh [cpu|gpu|prometheus|base|all ...]      (default: cpu)
#
# Images (tags overridable by env):
#   sglang-rq:cpu                  docker/Dockerfile.cpu   ($CPU_TAG)
#   sglang-rq:gpu                  docker/Dockerfile.gpu   ($GPU_TAG)
#   sglang-rq/prometheus:local     docker/Dockerfile.prometheus, offline only ($PROMETHEUS_TAG)
#   sglang-rq/bookworm-python:local  base made with debootstrap, offline only ($LOCAL_BASE)
#
# Docker Hub reachable (a laptop, CI): the Dockerfiles' defaults (python:3.11-slim-bookworm +
# CPU torch from download.pytorch.org; nvidia/cuda for the GPU image); `prometheus` is not needed
# (compose pulls prom/prometheus). Docker Hub unreachable (SGLANG_RQ_DOCKER_OFFLINE=1 forces it,
# =0 forbids it): first a base image is made from Debian packages (debootstrap --variant=minbase
# bookworm + python3 python3-venv python3-pip ca-certificates curl, `tar | docker import`), then
# the images are built FROM it with build args only; torch comes from PyPI (TORCH_INDEX_URL=""),
# whose x86_64 wheel is the CUDA build (runs on CPU; larger image).
#
# Extra CA certificates (an intercepting HTTPS proxy): SGLANG_RQ_EXTRA_CA=auto (default) copies
# the host's /usr/local/share/ca-certificates/*.crt into docker/ca/ (git-ignored) as host-*.crt;
# a file or directory path copies those; `none` copies nothing. The Dockerfiles trust whatever
# *.crt is in docker/ca/ and point pip at the system bundle only then.
#
# Idempotent: existing local base / Prometheus images are reused (REBUILD_BASE=1 to redo), and
# docker's layer cache makes a rebuild of an unchanged tree a no-op. Builds use --network host
# (DOCKER_BUILD_NETWORK) because engines started with --iptables=false (deploy/start_dockerd.sh)
# give bridged build containers no outbound NAT; it is harmless elsewhere.
set -euo pipefail
cd "$(dirname "$0")/.."

CPU_TAG=${CPU_TAG:-sglang-rq:cpu}
GPU_TAG=${GPU_TAG:-sglang-rq:gpu}
PROMETHEUS_TAG=${PROMETHEUS_TAG:-sglang-rq/prometheus:local}
LOCAL_BASE=${LOCAL_BASE:-sglang-rq/bookworm-python:local}
HUB_PROBE_IMAGE=${HUB_PROBE_IMAGE:-python:3.11-slim-bookworm}
DEBIAN_MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
NET=${DOCKER_BUILD_NETWORK-host}
NETARG=(); [ -n "$NET" ] && NETARG=(--network "$NET")

say() { echo "[build.sh] $*" >&2; }
size() { docker image inspect -f '{{.Size}}' "$1" | awk '{printf "%.2f GB", $1/1e9}'; }

docker info >/dev/null 2>&1 || { say "no Docker engine answers (start one: deploy/start_dockerd.sh)"; exit 1; }

targets=("$@"); [ ${#targets[@]} -eq 0 ] && targets=(cpu)
[ "${targets[0]}" = all ] && targets=(cpu prometheus gpu)

# ---------------------------------------------------------------- Docker Hub or offline
offline=${SGLANG_RQ_DOCKER_OFFLINE:-}
if [ -z "$offline" ]; then
  if docker image inspect "$HUB_PROBE_IMAGE" >/dev/null 2>&1 \
     || timeout 120 docker pull -q "$HUB_PROBE_IMAGE" >/dev/null 2>&1; then
    offline=0
  else
    offline=1
  fi
fi
if [ "$offline" = 1 ]; then
  say "Docker Hub unreachable (could not pull $HUB_PROBE_IMAGE): building on the local Debian base $LOCAL_BASE"
else
  say "Docker Hub reachable: Dockerfile defaults"
fi

# ---------------------------------------------------------------- extra CA certificates
mkdir -p docker/ca
rm -f docker/ca/host-*.crt
ca=${SGLANG_RQ_EXTRA_CA:-auto}
case "$ca" in
  none) ;;
  auto) for f in /usr/local/share/ca-certificates/*.crt; do
          [ -f "$f" ] && cp "$f" "docker/ca/host-$(basename "$f")"
        done ;;
  *) if [ -d "$ca" ]; then for f in "$ca"/*.crt "$ca"/*.pem; do
         [ -f "$f" ] && cp "$f" "docker/ca/host-$(basename "${f%.*}").crt"; done
     else cp "$ca" "docker/ca/host-$(basename "${ca%.*}").crt"; fi ;;
esac
cas=$(cd docker/ca && ls -- *.crt 2>/dev/null | tr '\n' ' ' || true)
say "extra CA certificates trusted in the images: ${cas:-none}"

# ---------------------------------------------------------------- local base (offline only)
build_base() {
  if docker image inspect "$LOCAL_BASE" >/dev/null 2>&1 && [ "${REBUILD_BASE:-0}" != 1 ]; then
    say "base $LOCAL_BASE exists ($(size "$LOCAL_BASE")), reused"
    return
  fi
  command -v debootstrap >/dev/null || { say "debootstrap missing: apt-get install debootstrap"; exit 1; }
  [ "$(id -u)" = 0 ] || { say "debootstrap needs root"; exit 1; }
  local root; root=$(mktemp -d /tmp/sglang-rq-rootfs.XXXXXX)
  ROOTFS=$root; trap 'rm -rf "$ROOTFS"' EXIT
  say "debootstrap --variant=minbase bookworm from $DEBIAN_MIRROR into $root (a few minutes)"
  local t0=$SECONDS
  debootstrap --variant=minbase --include=python3,python3-venv,python3-pip,ca-certificates,curl \
    bookworm "$root" "$DEBIAN_MIRROR" >/tmp/sglang-rq-debootstrap.log 2>&1 \
    || { tail -20 /tmp/sglang-rq-debootstrap.log >&2; exit 1; }
  cat >"$root/etc/apt/sources.list" <<EOF
deb $DEBIAN_MIRROR bookworm main
deb $DEBIAN_MIRROR bookworm-updates main
deb ${DEBIAN_MIRROR%/debian}/debian-security bookworm-security main
EOF
  rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/archives/*.deb "$root"/tmp/* "$root"/var/log/*.log
  say "importing as $LOCAL_BASE"
  tar -C "$root" --numeric-owner -c . | docker import \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'ENV LANG=C.UTF-8' --change 'CMD ["/bin/bash"]' \
    -m "debootstrap --variant=minbase bookworm + python3 python3-venv python3-pip ca-certificates curl" \
    - "$LOCAL_BASE" >/dev/null
  rm -rf "$root"
  say "base $LOCAL_BASE: $(size "$LOCAL_BASE"), $((SECONDS - t0)) s, $(docker run --rm "$LOCAL_BASE" python3 --version)"
}

build() {  # build TAG DOCKERFILE [build args...]
  local tag=$1 file=$2; shift 2
  local t0=$SECONDS
  say "docker build -f $file -t $tag ${NETARG[*]} $*"
  docker build "${NETARG[@]}" -f "$file" -t "$tag" "$@" .
  say "$tag: $(size "$tag"), $((SECONDS - t0)) s"
}

for t in "${targets[@]}"; do
  case "$t" in
    base) build_base ;;
    cpu)
      args=()
      if [ "$offline" = 1 ]; then
        build_base
        args=(--build-arg "BASE_IMAGE=$LOCAL_BASE" --build-arg "TORCH_INDEX_URL=${TORCH_INDEX_URL-}")
      elif [ -n "${TORCH_INDEX_URL+x}" ]; then
        args=(--build-arg "TORCH_INDEX_URL=$TORCH_INDEX_URL")
      fi
      build "$CPU_TAG" docker/Dockerfile.cpu "${args[@]}" ;;
    gpu)
      args=()
      if [ "$offline" = 1 ]; then
        build_base
        args=(--build-arg "CUDA_IMAGE=$LOCAL_BASE")
      fi
      build "$GPU_TAG" docker/Dockerfile.gpu "${args[@]}" ;;
    prometheus)
      if [ "$offline" = 1 ]; then
        build_base
        build "$PROMETHEUS_TAG" docker/Dockerfile.prometheus --build-arg "BASE_IMAGE=$LOCAL_BASE"
        say "use it in compose: PROMETHEUS_IMAGE=$PROMETHEUS_TAG"
      else
        say "Docker Hub reachable: compose pulls prom/prometheus, nothing to build"
      fi ;;
    *) say "unknown target $t (cpu|gpu|prometheus|base|all)"; exit 2 ;;
  esac
done
