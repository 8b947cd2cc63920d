#!/usr/bin/env bash
# One H200 call: kgate's catalogue under `kgate selftest --device cuda` (in the background), beside the
# GDN fixture's GPU tests and benchmark (fixtures/gdn/h200_run.sh). Carry .whl (fla-core) and
# .whl-kgate (pydantic, junit-xml: the device image lacks them). Writes into $OUT:
#   selftest.log selftest-report.json + what h200_run.sh writes.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-h200-out}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
  .whl-kgate/*.whl || exit 2
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader >"$OUT/selftest.log"
python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)' >>"$OUT/selftest.log"
(timeout "${SELFTEST_S:-300}" python3 -m kgate selftest --device cuda -j 4 --out /tmp/selftest >>"$OUT/selftest.log" 2>&1
 echo "selftest rc=$?" >>"$OUT/selftest.log"
 cp /tmp/selftest/report.json "$OUT/selftest-report.json" 2>/dev/null) &
PARTS=${PARTS:-tests bench} OUT="$OUT" bash fixtures/gdn/h200_run.sh
wait
tail -5 "$OUT/selftest.log"
