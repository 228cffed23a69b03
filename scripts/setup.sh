#!/usr/bin/env bash
# Idempotent install of sglang-rq and its pinned SGLang into a cached virtual environment.
# The venv lives outside the checkout (default ~/.cache/sglang-rq/venv-<hash of pyproject.toml>),
# so a second run, or CI on a machine that ran before, installs nothing (~7 min, ~11 GB the first time).
set -euo pipefail
cd "$(dirname "$0")/.."
hash=$(sha256sum pyproject.toml | cut -c1-12)
VENV=${SGLANG_RQ_VENV:-$HOME/.cache/sglang-rq/venv-$hash}
if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv "$VENV"
  "$VENV/bin/python" -m pip install -q --upgrade pip >&2
fi
# NOTE: locust first: it monkey-patches ssl through gevent, which recurses once sglang has
# imported ssl (the check then always failed and every run reinstalled). Both checks run from /:
# run from the checkout, `python -c` imports the checkout's own sglang_rq whatever the venv's
# editable install points at, so a second checkout sharing the cached venv ran the first one's code.
if ! (cd / && "$VENV/bin/python" -c "import locust, sglang, sglang_rq, pytest, ruff, smg, kubernetes_validate") 2>/dev/null \
   || [ "$(cd / && "$VENV/bin/python" -c 'import sglang_rq, os; print(os.path.dirname(os.path.dirname(sglang_rq.__file__)))')" != "$PWD" ]; then
  # pip's and setuptools' build chatter goes to a log; a failure shows its tail (the import
  # check below then stops the script)
  "$VENV/bin/python" -m pip install -q -e ".[test,serve,deploy,eval]" >"$VENV/pip-install.log" 2>&1 \
    || { echo "pip install failed, tail of $VENV/pip-install.log:" >&2; tail -30 "$VENV/pip-install.log" >&2; }
fi
"$VENV/bin/python" -c "import sglang, sglang_rq; print('sglang', sglang.__version__)" >&2
echo "$VENV"
