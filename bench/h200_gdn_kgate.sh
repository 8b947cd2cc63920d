#!/usr/bin/env bash
# One H200 call: the GDN fixture judged by kgate (dogfooding, fixtures/gdn/kgate.yaml, every entry,
# fla's included) beside the fixture's GPU tests and the stage-by-stage fault check. Carry .whl
# (fla-core) and .whl-kgate (pydantic, junit-xml). Writes into $OUT: memcheck.log tests.log kgate.log
# kgate-results.jsonl kgate-report.json (when the run ended by itself) kgate-logs.tar.gz.
# PREBUILD=1 also builds the audit corpus' extensions in the background at low priority
# (`kgate audit --compile-only`, docs/audit/README.md; carry .third_party/kb-corpus too) into
# /tmp/kgate-audit, where `bench/audit_h200.sh` finds them if the next call comes while the machine
# is warm; log in prebuild.log. TESTS= (empty) leaves the GPU tests out, MEMCHECK= the fault check.
# RESUME_FROM=PATH (a results.jsonl an earlier call brought back, e.g. committed under
# fixtures/gdn/kgate_h200/) continues that run with `kgate run --resume`: only the missing results are judged,
# so a manifest that needs more than one 10-minute call is judged in slices.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-h200-out}
mkdir -p "$OUT"
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 TRITON_DEFAULT_FP_FUSION=1
# installed once: rewriting /tmp/site under a running audit (bench/audit_bg.sh shares it) could break its imports
python3 -c "import pydantic, junit_xml, fla" 2>/dev/null || \
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    .whl-kgate/*.whl .whl/*.whl || exit 2
[ -n "${MEMCHECK-1}" ] && python3 bench/gdn_memcheck.py >"$OUT/memcheck.log" 2>&1
if [ -n "${PREBUILD:-}" ]; then
  (nice -n 19 python3 -m kgate audit --format kernelbench --problems .third_party/kb-corpus/problems \
     --candidates .third_party/kb-corpus/candidates --index .third_party/kb-corpus/index.csv --device cuda \
     --compile-jobs "${PREBUILD_JOBS:-8}" --compile-timeout 600 --out /tmp/kgate-audit --compile-only --resume \
     --max-time "${PREBUILD_S:-300}" -q >"$OUT/prebuild.log" 2>&1
   echo "prebuild rc=$?" >>"$OUT/prebuild.log") &
fi
[ -n "${TESTS-1}" ] && (timeout "${TEST_S:-200}" python3 -m pytest -q tests/test_gdn.py tests/test_gpu_faults.py -n 4 -p no:cacheprovider \
   >"$OUT/tests.log" 2>&1; echo "tests rc=$?" >>"$OUT/tests.log") &
# kgate's own output (one log per entry and worker) stays outside $OUT: a device call brings back 8 files at
# most; results.jsonl, report.json and the logs as one archive are copied into $OUT below
KOUT=/tmp/gdn-kgate
rm -rf "$KOUT" && mkdir -p "$KOUT"
resume=()
if [ -n "${RESUME_FROM:-}" ] && [ -s "$RESUME_FROM" ]; then
  cp "$RESUME_FROM" "$KOUT/results.jsonl" && resume=(--resume)
fi
# -j 14 with seven entries: each entry's gates go to two workers at once (kgate run --help)
timeout "${KGATE_S:-540}" python3 -m kgate run fixtures/gdn/kgate.yaml --device cuda -j "${JOBS:-14}" --out "$KOUT" \
  ${resume[@]+"${resume[@]}"} ${KGATE_ARGS:-} >"$OUT/kgate.log" 2>&1
echo "kgate rc=$?" >>"$OUT/kgate.log"
cp "$KOUT/results.jsonl" "$OUT/kgate-results.jsonl" 2>/dev/null
cp "$KOUT/report.json" "$OUT/kgate-report.json" 2>/dev/null
tar -czf "$OUT/kgate-logs.tar.gz" -C "$KOUT" logs 2>/dev/null
wait
cat "$OUT/memcheck.log" 2>/dev/null; tail -3 "$OUT/tests.log" 2>/dev/null; tail -2 "$OUT/prebuild.log" 2>/dev/null; tail -n 60 "$OUT/kgate.log" | cut -c1-220
