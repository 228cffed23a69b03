#!/usr/bin/env bash
# Start a Docker engine on a machine where none runs (containers/sandboxes without systemd).
# Does nothing if `docker info` already answers. Needs root and Debian's docker.io package
# (apt-get install docker.io docker-compose). The daemon runs:
#   dockerd --iptables=false --ip6tables=false --data-root $ROOT/data --exec-root $ROOT/exec
# with ROOT=${DOCKERD_ROOT:-/tmp/dockerd} and its log in $ROOT/log.
# --iptables=false because such sandboxes usually cannot program netfilter: bridged containers
# then have no outbound NAT, so builds that download use `docker build --network host`
# (docker/build.sh does); traffic between containers on a bridge network still works.
set -euo pipefail
ROOT=${DOCKERD_ROOT:-/tmp/dockerd}
if docker info >/dev/null 2>&1; then
  echo "docker engine already answers: $(docker info --format '{{.ServerVersion}} ({{.Driver}})')"
  exit 0
fi
command -v dockerd >/dev/null || { echo "dockerd not found: apt-get install docker.io" >&2; exit 1; }
mkdir -p "$ROOT/data" "$ROOT/exec"
echo "starting dockerd (data $ROOT/data, log $ROOT/log)"
nohup dockerd --iptables=false --ip6tables=false \
  --data-root "$ROOT/data" --exec-root "$ROOT/exec" >>"$ROOT/log" 2>&1 &
echo $! >"$ROOT/dockerd.pid"
for _ in $(seq 60); do
  if docker info >/dev/null 2>&1; then
    echo "docker engine up: $(docker info --format '{{.ServerVersion}} ({{.Driver}})'), pid $(cat "$ROOT/dockerd.pid")"
    exit 0
  fi
  sleep 1
done
echo "dockerd did not answer within 60 s; see $ROOT/log" >&2
tail -20 "$ROOT/log" >&2
exit 1
