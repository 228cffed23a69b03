#!/usr/bin/env bash
# Install the Prometheus server and promtool (rules/config checker) binaries from Debian's
# `prometheus` package (2.42.0 on bookworm) without installing the service: download the .deb
# with apt and extract only usr/bin/{prometheus,promtool} into DEST (default /usr/local/bin).
set -euo pipefail
DEST=${1:-/usr/local/bin}
if [ -x "$DEST/prometheus" ] && [ -x "$DEST/promtool" ]; then
  "$DEST/prometheus" --version 2>&1 | head -1; exit 0
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
(cd "$tmp" && apt-get download prometheus >/dev/null 2>&1 || { apt-get update >/dev/null && apt-get download prometheus; })
dpkg -x "$tmp"/prometheus_*.deb "$tmp/x"
install -m 0755 "$tmp/x/usr/bin/promtool" "$DEST/promtool"
install -m 0755 "$tmp/x/usr/bin/prometheus" "$DEST/prometheus"
"$DEST/prometheus" --version 2>&1 | head -1
