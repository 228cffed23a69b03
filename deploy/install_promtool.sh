#!/usr/bin/env bash
# Install promtool (rules/config checker) from Debian's `prometheus` package without installing
# the Prometheus service: download the .deb, extract only usr/bin/promtool.
set -euo pipefail
DEST=${1:-/usr/local/bin}
command -v promtool >/dev/null && { promtool --version | head -1; exit 0; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
(cd "$tmp" && apt-get download prometheus >/dev/null 2>&1 || { apt-get update >/dev/null && apt-get download prometheus; })
dpkg -x "$tmp"/prometheus_*.deb "$tmp/x"
install -m 0755 "$tmp/x/usr/bin/promtool" "$DEST/promtool"
"$DEST/promtool" --version | head -1
