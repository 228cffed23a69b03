#!/usr/bin/env bash
# Install (cached), serve the embedded looped model with the ResidualQuant KV cache on this machine
# (CPU if there is no GPU), ask it the first GSM8K test question (or, without the data beside the checkout, a
# GSM8K train-split question) over the OpenAI API, show the KV metrics.
# The server keeps running (PID printed); stop it with: kill <PID>. It sleeps when idle
# (SGLang's --sleep-on-idle: its scheduler loop otherwise keeps a CPU core busy with no requests).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=$(./scripts/setup.sh)
PORT=${PORT:-30000}
LOG=${LOG:-/tmp/sglang-rq-quickstart.log}
# Before touching $LOG, which an earlier quickstart's server may be writing: a lock its server
# holds for its lifetime (inherited descriptor 9), and any HTTP answer on the port (503 while
# it starts).
busy="error: an earlier quickstart's server still runs (or something answers on port $PORT); kill its PID, or pass PORT=... and LOG=..."
if command -v flock >/dev/null; then
  exec 9>>"$LOG.lock"
  flock -n 9 || { echo "$busy" >&2; exit 1; }
fi
if curl -s -o /dev/null "localhost:$PORT/health" 2>/dev/null; then echo "$busy" >&2; exit 1; fi
"$VENV/bin/sglang-rq" serve --port "$PORT" --enable-metrics --sleep-on-idle "$@" >"$LOG" 2>&1 &
PID=$!
echo "sglang-rq serve started (pid $PID, log $LOG); waiting for it to be ready..."
READY_S=${READY_S:-600}
ready=0
for _ in $(seq "$READY_S"); do
  if curl -sf "localhost:$PORT/health" >/dev/null && grep -q "fired up" "$LOG"; then ready=1; break; fi
  if ! kill -0 "$PID" 2>/dev/null; then echo "server exited:"; tail -30 "$LOG"; exit 1; fi
  sleep 1
done
if [ "$ready" != 1 ]; then
  echo "server not ready after ${READY_S} s (READY_S): stopping it; log $LOG:"; tail -30 "$LOG"
  kill "$PID" 2>/dev/null; exit 1
fi
DATA_DIR=${SGLANG_RQ_DATA_DIR:-../shared/data}
QUESTION=$("$VENV/bin/python" -c "
import json, sys; print(json.loads(open(sys.argv[1] + '/gsm8k/test.jsonl').readline())['question'])" "$DATA_DIR" 2>/dev/null \
  || { echo "(no $DATA_DIR/gsm8k/test.jsonl, so the built-in question; SGLANG_RQ_DATA_DIR picks a data directory)" >&2
       echo "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. How many clips did Natalia sell altogether in April and May?"; })
BODY=$("$VENV/bin/python" -c "import json,sys; print(json.dumps({'model': 'default', 'temperature': 0, 'max_tokens': 128,
  'messages': [{'role': 'user', 'content': sys.argv[1]}]}))" "$QUESTION")
echo "Q: $QUESTION"
curl -s "localhost:$PORT/v1/chat/completions" -H 'content-type: application/json' -d "$BODY" \
  | "$VENV/bin/python" -c "import json,sys; r=json.load(sys.stdin); print('A:', r['choices'][0]['message']['content'])"
curl -s "localhost:$PORT/metrics" | grep -E "^sglang:(max_total_num_tokens|token_usage)" || true
echo "server still running: pid $PID (kill $PID to stop)"
