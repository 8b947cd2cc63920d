#!/usr/bin/env bash
# The sandbox on a GPU machine: bubblewrap's probe, the catalogue of controls (its CUDA ones Triton kernels) under
# `kgate selftest --device cuda --sandbox require`, an audit of a Triton candidate and a CUDA C++ extension
# (built with nvcc inside the sandbox) on the GPU, and the sandbox's cost to a worker's start with a CUDA
# context. Needs kgate installed (pip install -e .) and bwrap on the PATH.
#   bash bench/sandbox_gpu.sh --out DIR
set -u
OUT=sandbox-gpu-out
while [ $# -gt 0 ]; do
  case "$1" in
    --out) OUT=$2; shift 2 ;;
    *) echo "usage: bash bench/sandbox_gpu.sh [--out DIR]" >&2; exit 2 ;;
  esac
done
cd "$(dirname "$0")/.."
mkdir -p "$OUT"
log="$OUT/sandbox-gpu.log"
{
  python3 bench/environment.py torch triton
  bwrap --version
  python3 -c 'from kgate import sandbox; print("sandbox:", sandbox.choose("auto").describe())'
  echo "--- kgate selftest --device cuda --sandbox require"
  timeout 300 python3 -m kgate selftest --device cuda -j 4 --sandbox require --out "$OUT/selftest"
  echo "selftest rc=$?"
  echo "--- kgate audit (Triton candidate, CUDA extension) --device cuda --sandbox require"
  timeout 400 python3 -m kgate audit --format kernelbench --problems tests/data/sandbox/gpu/problems \
    --candidates tests/data/sandbox/gpu/candidates --device cuda --sandbox require --out "$OUT/audit" -q
  echo "audit rc=$?"
  python3 - "$OUT/audit/results.jsonl" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    print(r["id"], "standard:", (r.get("standard") or {}).get("verdict"), "compile:", (r.get("compile") or {}).get("ok"),
          {g["gate"]: g["verdict"] for g in r["gates"]}, r.get("error") or "")
PY
  echo "--- worker start, CUDA context, sandbox vs none"
  python3 bench/sandbox_start.py --repeat 10 --cuda --json "$OUT/sandbox-start-cuda.json"
  python3 bench/sandbox_start.py --repeat 10 --bare --json "$OUT/sandbox-start-bare.json"
} >"$log" 2>&1
tail -40 "$log"
