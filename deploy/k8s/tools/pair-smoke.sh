#!/usr/bin/env bash
# Smoke-check the engine-pair supervisor on a GPU host, outside Kubernetes: start both
# vLLM engines on one GPU exactly as the StatefulSet does, wait until both answer
# /health, send a little load to each, then stop the pair and check that no engine
# process is left behind. With --crash, also SIGKILL the speculative engine's API
# server and check that the supervisor stops the pair and leaves no orphaned worker.
#
#   deploy/k8s/tools/pair-smoke.sh [--crash] MODEL [extra vllm serve flags...]
#   deploy/k8s/tools/pair-smoke.sh --crash ./qwen3-8b-dummy --load-format dummy --max-model-len 4096
#
# Needs: vllm on PATH (or ENGINE_BIN), one free GPU, ports SPEC_PORT/BASE_PORT (8001/8002)
# free. Output: time to healthy, GPU memory per process, output tok/s of each engine,
# exit codes, and any process left behind.
set -u
CRASH=0
if [ "${1:-}" = "--crash" ]; then CRASH=1; shift; fi
[ $# -ge 1 ] || { sed -n '2,12p' "$0"; exit 2; }
HERE="$(cd "$(dirname "$0")" && pwd)"
SUPERVISOR="$HERE/../engines/vllm-pair/supervisor.py"
LOGDIR="${LOGDIR:-$(mktemp -d)}"
export MODEL="$1"; shift
export ENGINE_ARGS="$* --disable-uvicorn-access-log"
export SPEC_SERVED_MODEL_NAME=pair-spec BASE_SERVED_MODEL_NAME=pair-base
export SPEC_PORT="${SPEC_PORT:-8001}" BASE_PORT="${BASE_PORT:-8002}"
POLL_S="${POLL_S:-3}" SETTLE_S="${SETTLE_S:-2}"
export GPU_MEMORY_UTILIZATION="${GPU_MEMORY_UTILIZATION:-0.45}" GRACE_S="${GRACE_S:-45}"
export SPEC_CONFIG="${SPEC_CONFIG:-{\"method\": \"ngram\", \"num_speculative_tokens\": 5, \"prompt_lookup_min\": 2, \"prompt_lookup_max\": 5\}}"

both_healthy() {  # the StatefulSet's probe
  python3 -c "import urllib.request as r; [r.urlopen('http://127.0.0.1:%d/health' % p, timeout=4) for p in ($BASE_PORT, $SPEC_PORT)]" 2>/dev/null
}
FAIL=0
leftovers() {
  if pgrep -af "vllm serve|EngineCore|--port ($SPEC_PORT|$BASE_PORT)" | grep -v pgrep; then
    echo "FAIL: engine processes left behind"; FAIL=1
  else
    echo "no engine process left"
  fi
  if command -v nvidia-smi >/dev/null; then nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader; fi
  return 0
}
start_pair() {
  python3 "$SUPERVISOR" > "$LOGDIR/$1.log" 2>&1 &
  SUP=$!
  local t0=$SECONDS
  until both_healthy; do
    kill -0 $SUP 2>/dev/null || { echo "supervisor exited:"; tail -30 "$LOGDIR/$1.log"; return 1; }
    [ $((SECONDS - t0)) -gt "${STARTUP_LIMIT_S:-1200}" ] && { echo "not healthy in time"; return 1; }
    sleep "$POLL_S"
  done
  echo "both engines healthy after $((SECONDS - t0))s"
}
load() {
  python3 - <<'PY'
import json, os, time, urllib.request, concurrent.futures as cf
prompt = " ".join(f"word{i}" for i in range(150)) * 3
for port, name in ((int(os.environ["SPEC_PORT"]), "pair-spec"), (int(os.environ["BASE_PORT"]), "pair-base")):
    body = json.dumps({"model": name, "prompt": prompt, "max_tokens": 128, "temperature": 0,
                       "ignore_eos": True}).encode()
    def post(_):
        req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", body,
                                     {"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=300) as r:
            return json.loads(r.read())["usage"]["completion_tokens"]
    post(0)
    t0 = time.time()
    with cf.ThreadPoolExecutor(8) as ex:
        tokens = sum(ex.map(post, range(16)))
    print(f"{name}: 16 requests, 8 concurrent, {tokens / (time.time() - t0):.0f} output tok/s")
PY
}

echo "logs in $LOGDIR"
start_pair run1 || { leftovers; exit 1; }
if command -v nvidia-smi >/dev/null; then nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader; fi
load || { echo "FAIL: load"; FAIL=1; }
t0=$SECONDS; kill -TERM $SUP; wait $SUP; rc=$?
echo "SIGTERM: supervisor exit code $rc after $((SECONDS - t0))s"
[ $rc = 0 ] || { echo "FAIL: a requested stop must exit 0"; FAIL=1; }
sleep "$SETTLE_S"; leftovers
if [ $CRASH = 1 ]; then
  start_pair run2 || { leftovers; exit 1; }
  kill -KILL "$(pgrep -f -- "--port $SPEC_PORT" | head -1)"
  t0=$SECONDS; wait $SUP; rc=$?
  echo "spec engine SIGKILLed: supervisor exit code $rc after $((SECONDS - t0))s"
  [ $rc != 0 ] || { echo "FAIL: a dead engine must stop the pair with a failure code"; FAIL=1; }
  sleep "$SETTLE_S"; leftovers
fi
[ $FAIL = 0 ] && echo "pair smoke check passed" || echo "pair smoke check FAILED"
exit $FAIL
