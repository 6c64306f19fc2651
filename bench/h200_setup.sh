#!/usr/bin/env bash
# Sourced by the staged GPU scripts (speed_h200.sh, faithful_h200.sh) after they set `out` and
# `budget`: installs the wheels carried in .whl/ into /tmp/site, records the machine in
# $out/env.txt (COMMIT names the measured tree: the device copy's git HEAD is stale), writes the
# golden-formula benchmark weights once (not with SKIP_WEIGHTS=1), and defines `step NAME TIMEOUT COMMAND...`, which runs
# a command into $out/NAME.txt while the budget allows and prints its last result lines.
mkdir -p "$out"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH="/tmp/site:$PWD"
else
  export PYTHONPATH="$PWD"
fi
export PYTHONUNBUFFERED=1
{ nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
  python3 -c "import torch, triton; print('torch', torch.__version__, 'cuda', \
torch.version.cuda, 'triton', triton.__version__)"
  python3 -c "import fa3_fwd_interface; print('fa3-fwd loads')" 2>&1 | tail -1
  echo "commit ${COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}"
} > "$out/env.txt" 2>&1
cat "$out/env.txt"
[ "${SKIP_WEIGHTS:-0}" = 1 ] || python3 bench/bench_weights.py || exit 1
step() {  # step NAME TIMEOUT COMMAND...: run it if the budget allows
  local name=$1 limit=$2; shift 2
  local left=$((budget - SECONDS))
  if [ "$left" -lt 25 ]; then echo "skipped $name (budget)" | tee "$out/$name.txt"; return; fi
  [ "$limit" -gt "$left" ] && limit=$left
  timeout "$limit" "$@" > "$out/$name.txt" 2>&1
  echo "== $name: rc $? at ${SECONDS}s:" \
    "$(grep -E 'FPS|passed|failed|PASS|FAIL' "$out/$name.txt" | tail -n 2 | tr '\n' ' ')"
}
