#!/usr/bin/env bash
# The real-GPU run, one stage per call on a machine with one H200 (no network there).
#
#   stage carry DIR   copy carried chunks (DIR/bundle.part*) into /tmp/wh
#   stage up          reassemble + install vLLM (the bundle's version), write the random-weight models,
#                     start the engine set (engines.py), wait, probe the contract
#   stage sweep ARGS  loadtests/gpu/sweep.py --target real ARGS, results tarred into $OUT
#   stage interleave ARGS   loadtests/gpu/interleave.py --target real ARGS (policies in
#                     interleaved windows), results and final /metrics pages tarred into $OUT
#   stage day ARGS    loadtests/gpu/day.py --target real ARGS (a compressed day), likewise
#   stage dsd         prints the Dynamic SD engine that came up (for direct:<engine> slots)
#   stage move_check ARGS   loadtests/gpu/move_check.py --target real ARGS (a stream moved
#                     between the engines mid-answer), likewise
#
# The wheel bundle (see README.md): a tar of vLLM 0.20.2's dependency wheels plus the vLLM
# wheel's contents as vllm.tar.xz, split into <= 58 MB parts so that each call carries one.
# Engines run in their own process sessions and survive between calls while the machine
# stays warm. Outputs go to $OUT (at most 8 files come back: tar what is many).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT" /tmp/wh /tmp/vlogs
export PYTHONPATH=/tmp/site:$PWD HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1
export PYTHONUNBUFFERED=1
stage=${1:?stage}
shift

case "$stage" in
carry)
  cp "$1"/bundle.part* /tmp/wh/ && ls -la /tmp/wh && df -h /tmp | tail -1
  ;;
up)
  t0=$(date +%s)
  if [ ! -d /tmp/site/vllm ]; then
    cat /tmp/wh/bundle.part* > /tmp/wh/bundle.tar || exit 1
    echo "bundle sha256 $(sha256sum /tmp/wh/bundle.tar | cut -d' ' -f1) (want $(cat "${BUNDLE_SHA:-/dev/null}" 2>/dev/null))"
    rm -f /tmp/wh/bundle.part*
    mkdir -p /tmp/wh/x && tar xf /tmp/wh/bundle.tar -C /tmp/wh/x && rm -f /tmp/wh/bundle.tar || exit 1
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site \
      /tmp/wh/x/*.whl 2>&1 | grep -v "^WARNING: Target directory" | tail -5
    if command -v xz >/dev/null; then
      xz -dc -T0 /tmp/wh/x/vllm.tar.xz | tar xf - -C /tmp/site || exit 1
    else
      python3 -c "import tarfile; tarfile.open('/tmp/wh/x/vllm.tar.xz').extractall('/tmp/site')" || exit 1
    fi
    echo "installed in $(( $(date +%s) - t0 ))s"
  fi
  python3 -c "import vllm, torch, pydantic, aiohttp; print('vllm', vllm.__version__, 'torch', torch.__version__, 'pydantic', pydantic.VERSION, 'aiohttp', aiohttp.__version__)" || exit 1
  python3 loadtests/gpu/dummy_models.py /tmp/vmodels || exit 1
  python3 loadtests/gpu/engines.py start --models /tmp/vmodels --logs /tmp/vlogs ${ENGINES:+--engines $ENGINES} \
    ${MAX_NUM_SEQS:+--max-num-seqs $MAX_NUM_SEQS} ${KV_GIB:+--kv-gib $KV_GIB}
  python3 loadtests/gpu/engines.py wait --logs /tmp/vlogs --timeout "${WAIT_S:-420}"
  rc=$?
  nvidia-smi --query-gpu=name,memory.used,memory.total,driver_version --format=csv | tee "$OUT/nvidia-smi.txt"
  {
    echo "date: $(date -u +%FT%TZ)"
    python3 -c "import vllm, torch, sys; print('vllm', vllm.__version__); print('torch', torch.__version__, 'cuda', torch.version.cuda); print('python', sys.version.split()[0])"
    python3 loadtests/gpu/engines.py list --models /tmp/vmodels ${MAX_NUM_SEQS:+--max-num-seqs $MAX_NUM_SEQS} \
      ${KV_GIB:+--kv-gib $KV_GIB}
    cat "$OUT/nvidia-smi.txt"
  } > "$OUT/versions.txt" 2>&1
  python3 loadtests/gpu/probe.py /tmp/probe "$(python3 -c 'import json; print(",".join(json.load(open("/tmp/vlogs/ready.json"))))')"
  grep -hE "KV cache|GPU blocks|Maximum concurrency|speculative|SpeculativeConfig|Error|error" /tmp/vlogs/*.log | grep -v "^.*DEBUG" | cut -c1-300 | head -40
  du -sh ~/.cache/vllm ~/.triton ~/.cache/torch /tmp/torchinductor_* 2>/dev/null  # compile caches (a lead: carry them)
  tar czf "$OUT/up.tar.gz" -C /tmp probe vlogs
  echo "up done in $(( $(date +%s) - t0 ))s rc=$rc"
  exit $rc
  ;;
sweep)
  tag=${TAG:-sweep}
  python3 loadtests/gpu/engines.py status --logs /tmp/vlogs
  python3 loadtests/gpu/sweep.py --target real --out "/tmp/$tag" "$@" 2>&1 | tee "$OUT/$tag.log"
  tar czf "$OUT/$tag.tar.gz" -C /tmp "$tag"
  tar czf "$OUT/vlogs-$tag.tar.gz" -C /tmp vlogs
  ;;
dsd)  # the Dynamic SD engine that came up (ready.json), for direct:<engine> slots
  python3 -c 'import json; r = json.load(open("/tmp/vlogs/ready.json")); print(next((n for n in ("eagle3-dsd", "eagle3-dsd1") if n in r), ""))'
  ;;
interleave|day|move_check)
  tag=${TAG:-$stage}
  python3 loadtests/gpu/engines.py status --logs /tmp/vlogs
  python3 "loadtests/gpu/$stage.py" --target real --out "/tmp/$tag" "$@" 2>&1 | tee "$OUT/$tag.log"
  rc=${PIPESTATUS[0]}
  mkdir -p "/tmp/$tag/pages"
  python3 - "/tmp/$tag/pages" <<'PY' || true
import json, sys, urllib.request
sys.path.insert(0, "loadtests/gpu")
from engines import by_name
for name in json.load(open("/tmp/vlogs/ready.json")):
    with urllib.request.urlopen(by_name(name).url + "/metrics", timeout=10) as r:
        open(f"{sys.argv[1]}/final-{name}.txt", "wb").write(r.read())
PY
  tar czf "$OUT/$tag.tar.gz" -C /tmp "$tag"
  grep -hE "preempt|Preempt" /tmp/vlogs/*.log | tail -5
  exit "$rc"
  ;;
*)
  echo "unknown stage $stage" >&2
  exit 2
  ;;
esac
