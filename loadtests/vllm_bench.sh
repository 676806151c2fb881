#!/usr/bin/env bash
# Drive specgate with vLLM's own benchmark client (`vllm bench serve`), on specgate's corpus.
#
#   loadtests/vllm_bench.sh --install                # once: vLLM's client in its own venv
#   loadtests/vllm_bench.sh http://gateway:8000      # against a running gateway
#   loadtests/vllm_bench.sh --emulated               # starts an emulated pair + gateway here
#
# Environment (defaults in brackets):
#   VLLM_VENV [.venv-vllm]   virtualenv holding vllm (a heavy client, not a gateway dependency)
#   PY [.venv/bin/python]    python with specgate installed (exports the corpus)
#   MODEL [qwen3-8b]         model name the gateway serves
#   NUM_PROMPTS [200]  RATE [4]  TEMPERATURE [0]  SEED [1]  MIX [default]  OUT [out/vllm-bench]
#   EXTRA: more `vllm bench serve` flags, e.g. EXTRA="--goodput tpot:30 --max-concurrency 64"
#
# The corpus is exported as vLLM's `custom` dataset (JSONL of {"prompt", "output_tokens"});
# `--skip-chat-template` sends each prompt as one user message, `--custom-output-len -1`
# keeps each request's own max_tokens. vLLM's client applies ONE temperature to every
# request (TEMPERATURE), unlike the Locust kit's per-request distribution.
# Tokens are counted with loadtests/vllm-tokenizer (no model hub needed): one token per
# word or punctuation run, like specgate's own estimate.
set -euo pipefail
cd "$(dirname "$0")/.."

VLLM_VENV=${VLLM_VENV:-.venv-vllm}
PY=${PY:-.venv/bin/python}
MODEL=${MODEL:-qwen3-8b}
NUM_PROMPTS=${NUM_PROMPTS:-200}
RATE=${RATE:-4}
TEMPERATURE=${TEMPERATURE:-0}
SEED=${SEED:-1}
MIX=${MIX:-default}
OUT=${OUT:-out/vllm-bench}
EXTRA=${EXTRA:-}

if [[ "${1:-}" == "--install" ]]; then
  python3 -m venv "$VLLM_VENV"
  # torch 2.13.0 comes from a CPU wheel; vLLM 0.27.1 pins it. The CUDA builds of
  # torchvision/torchaudio/torchcodec do not match the CPU torch and break the import.
  "$VLLM_VENV/bin/pip" install torch==2.13.0 vllm==0.27.1 pandas  # pandas: the custom dataset loader
  "$VLLM_VENV/bin/pip" uninstall -y torchvision torchaudio torchcodec
  "$VLLM_VENV/bin/vllm" bench serve --help >/dev/null && echo "vllm bench serve is ready in $VLLM_VENV"
  exit 0
fi

PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT

free_port() { "$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_http() {  # url, seconds
  for _ in $(seq 1 $(( $2 * 5 ))); do
    if "$PY" -c "import sys,urllib.request; urllib.request.urlopen(sys.argv[1], timeout=1)" "$1" 2>/dev/null; then
      return 0; fi
    sleep 0.2
  done
  echo "not ready: $1" >&2; return 1
}

mkdir -p "$OUT"
if [[ "${1:-}" == "--emulated" ]]; then
  SP=$(free_port); BP=$(free_port); GP=$(free_port)
  "$PY" -m gateway emulate --pair --spec-port "$SP" --base-port "$BP" >"$OUT/emulator.log" 2>&1 &
  PIDS+=($!)
  wait_http "http://127.0.0.1:$SP/health" 60; wait_http "http://127.0.0.1:$BP/health" 60
  "$PY" -c "import sys, yaml; from specgate_lab.bench.procs import gateway_config as g; \
yaml.safe_dump(g(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), 'adaptive'), open(sys.argv[4], 'w'))" \
    "$GP" "$SP" "$BP" "$OUT/gateway.yaml"
  "$PY" -m gateway serve --config "$OUT/gateway.yaml" >"$OUT/gateway.log" 2>&1 &
  PIDS+=($!)
  wait_http "http://127.0.0.1:$GP/ready" 60
  BASE_URL="http://127.0.0.1:$GP"
else
  BASE_URL=${1:-http://127.0.0.1:8000}
fi

"$PY" -m specgate_lab.workload --n "$NUM_PROMPTS" --seed "$SEED" --mix "$MIX" --format vllm \
  --out "$OUT/corpus.jsonl"

# shellcheck disable=SC2086
"$VLLM_VENV/bin/vllm" bench serve \
  --backend openai-chat --base-url "$BASE_URL" --endpoint /v1/chat/completions \
  --model "$MODEL" --tokenizer loadtests/vllm-tokenizer \
  --dataset-name custom --dataset-path "$OUT/corpus.jsonl" \
  --custom-output-len -1 --skip-chat-template \
  --num-prompts "$NUM_PROMPTS" --request-rate "$RATE" --seed "$SEED" --temperature "$TEMPERATURE" \
  --percentile-metrics ttft,tpot,itl,e2el --metric-percentiles 50,99 \
  --save-result --result-dir "$OUT" --result-filename vllm-bench.json $EXTRA \
  2>&1 | tee "$OUT/vllm-bench.txt"
