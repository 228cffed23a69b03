#!/usr/bin/env bash
# Install (cached) and run the whole test suite on CPU: codec, accounting, real SGLang engines,
# Triton kernels under TRITON_INTERPRET=1. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=$(./scripts/setup.sh)
exec "$VENV/bin/python" -m pytest -q -rs "$@" tests
