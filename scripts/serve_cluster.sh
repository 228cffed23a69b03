#!/usr/bin/env bash
# Start N sglang-rq workers and the smg router (cache-aware) on this machine.
#
#   scripts/serve_cluster.sh [-n N] [-p ROUTER_PORT] [-b WORKER_BASE_PORT] [-m ROUTER_METRICS_PORT]
#                            [--policy P] [-- WORKER_FLAGS...]
#
# Workers listen on WORKER_BASE_PORT..+N-1 (each `python -m sglang_rq.launch_server --enable-metrics`,
# so the embedded mini-Ouro on CPU unless --model-path is given after --); the router listens on
# ROUTER_PORT (OpenAI API + /generate; default 30000), exports smg_* metrics on ROUTER_METRICS_PORT
# (default 29000), and health-checks every worker on
# /rq/ready, the readiness canary, so a worker that answers wrong leaves the rotation.
# Logs: $LOG_DIR (default ./cluster-logs). Ctrl-C or SIGTERM stops everything this script started.
set -euo pipefail

N=2 ROUTER_PORT=30000 BASE=31000 METRICS_PORT=29000 POLICY=cache_aware
LOG_DIR=${LOG_DIR:-./cluster-logs}
# The project's Python: $PYTHON, else the cached venv of scripts/setup.sh (installs on first use).
PY=${PYTHON:-$("$(dirname "$0")/setup.sh")/bin/python}
while [[ $# -gt 0 ]]; do
  case "$1" in
    -n) N=$2; shift 2 ;;
    -p) ROUTER_PORT=$2; shift 2 ;;
    -b) BASE=$2; shift 2 ;;
    -m) METRICS_PORT=$2; shift 2 ;;
    --policy) POLICY=$2; shift 2 ;;
    --) shift; break ;;
    *) echo "unknown option $1 (worker flags go after --)" >&2; exit 2 ;;
  esac
done
WORKER_FLAGS=("$@")
# smg routes by model id: serve every worker as "default" (what the docs' requests name) unless
# the worker flags choose a name.
if [[ " ${WORKER_FLAGS[*]-} " != *" --served-model-name"* ]]; then
  WORKER_FLAGS=(--served-model-name default "${WORKER_FLAGS[@]}")
fi
mkdir -p "$LOG_DIR"
PIDS=()
cleanup() {
  for pid in "${PIDS[@]}"; do kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
}
trap cleanup EXIT INT TERM

URLS=()
for ((i = 0; i < N; i++)); do
  port=$((BASE + i))
  setsid "$PY" -m sglang_rq.launch_server --host 127.0.0.1 --port "$port" --enable-metrics \
    "${WORKER_FLAGS[@]}" >"$LOG_DIR/worker-$i.log" 2>&1 &
  PIDS+=($!)
  URLS+=("http://127.0.0.1:$port")
  echo "worker $i: pid $! ${URLS[-1]} (log $LOG_DIR/worker-$i.log)"
done

# The router waits for every worker to pass /rq/ready before it accepts traffic. A transport
# failure excludes a worker only once it has been silent for --worker-stall-secs (2 s), so the
# retries span more than that (200 + 400 + 800 + 1600 ms before the fifth attempt); the
# router's default schedule (5 x 50 ms x 1.5^k, under 1 s) can spend every retry on a worker
# that just died while cache-aware routing still prefers it.
setsid "$PY" -m smg.launch_router --host 127.0.0.1 --port "$ROUTER_PORT" \
  --worker-urls "${URLS[@]}" --policy "$POLICY" \
  --retry-max-retries 6 --retry-initial-backoff-ms 200 --retry-backoff-multiplier 2 \
  --max-payload-size 4194304 \
  --health-check-endpoint /rq/ready --health-check-interval-secs 10 \
  --health-failure-threshold 2 --health-success-threshold 1 \
  --worker-startup-timeout-secs 900 --worker-startup-check-interval 5 \
  --prometheus-host 127.0.0.1 --prometheus-port "$METRICS_PORT" \
  --log-dir "$LOG_DIR" >"$LOG_DIR/router.log" 2>&1 &
PIDS+=($!)
echo "router: pid $! http://127.0.0.1:$ROUTER_PORT (metrics :$METRICS_PORT/metrics, policy $POLICY)"
wait -n "${PIDS[@]}" || true  # (set -e would otherwise exit before the message)
echo "a process exited; stopping the cluster (logs in $LOG_DIR)" >&2
