#!/usr/bin/env bash
# Install (cached) and run the whole test suite on CPU: codec, accounting, real SGLang engines,
# Triton kernels under TRITON_INTERPRET=1. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=$(./scripts/setup.sh)
# promtool (checks the Prometheus rules) from Debian's package into the venv; best effort.
./deploy/install_prometheus.sh "$VENV/bin" >&2 || echo "prometheus/promtool unavailable: their tests will be skipped" >&2
export PATH="$VENV/bin:$PATH"
# The whole tests/ tree unless a test path is given (`./scripts/test.sh tests/test_codec.py -x`).
has_path=0
for a in "$@"; do
  case $a in -*) ;; *) [ -e "${a%%::*}" ] && has_path=1 ;; esac
done
[ $has_path = 1 ] || set -- "$@" tests
exec "$VENV/bin/python" -m pytest -q -rs "$@"
