#!/usr/bin/env bash
# One H200 call: the GDN fixture judged by kgate (dogfooding, fixtures/gdn/kgate.yaml, every entry,
# fla's included) beside the fixture's GPU tests and the stage-by-stage fault check. Carry .whl
# (fla-core) and .whl-kgate (pydantic, junit-xml). Writes into $OUT: memcheck.log tests.log kgate.log
# kgate/ (results.jsonl, report.json, junit.xml).
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-h200-out}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
  .whl-kgate/*.whl .whl/*.whl || exit 2
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 TRITON_DEFAULT_FP_FUSION=1
[ -n "${MEMCHECK-1}" ] && python3 bench/gdn_memcheck.py >"$OUT/memcheck.log" 2>&1
(timeout "${TEST_S:-200}" python3 -m pytest -q tests/test_gdn.py -n 4 -p no:cacheprovider >"$OUT/tests.log" 2>&1
 echo "tests rc=$?" >>"$OUT/tests.log") &
timeout "${KGATE_S:-330}" python3 -m kgate run fixtures/gdn/kgate.yaml --device cuda -j "${JOBS:-4}" --out "$OUT/kgate" \
  ${KGATE_ARGS:-} >"$OUT/kgate.log" 2>&1
echo "kgate rc=$?" >>"$OUT/kgate.log"
wait
cat "$OUT/memcheck.log"; tail -3 "$OUT/tests.log"; tail -n 60 "$OUT/kgate.log" | cut -c1-220
