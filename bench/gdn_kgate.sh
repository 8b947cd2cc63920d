#!/usr/bin/env bash
# kgate on the GDN fixture (fixtures/gdn/kgate.yaml: the five family members and fla-core's kernel) on a GPU,
# with the machine's description, optionally beside the fixture's GPU tests and its stage-by-stage fault check.
# Needs kgate installed (pip install -e '.[audit]'), a CUDA GPU and, for the fla entries, fla-core
# (pip install fla-core); the tests need pytest-xdist (pip install -e '.[test]').
#
#   bash bench/gdn_kgate.sh --out DIR [--jobs N] [--tests] [--memcheck] [--resume] [-- KGATE_RUN_ARGS...]
#
# Writes into DIR: environment.txt (GPU, driver, torch, Triton, fla-core, kgate commit), kgate.log and kgate's
# own output under DIR/kgate (results.jsonl, report.json, junit.xml, logs/); with --tests tests.log
# (tests/test_gdn.py and tests/test_gpu_faults.py), with --memcheck memcheck.log (bench/gdn_memcheck.py).
# --resume continues DIR/kgate/results.jsonl of an earlier run: only the (kernel, gate) results it lacks are
# judged. Arguments after -- go to `kgate run`, e.g. -- -k gdn-chunk --dtype float32.
set -u
usage() { echo "usage: bash bench/gdn_kgate.sh --out DIR [--jobs N] [--tests] [--memcheck] [--resume] [-- ARGS]" >&2; exit 2; }
OUT="" JOBS=14 TESTS="" MEMCHECK="" RESUME=""
while [ $# -gt 0 ]; do
  case "$1" in
    --out) [ $# -ge 2 ] || usage; OUT=$2; shift 2 ;;
    --jobs) [ $# -ge 2 ] || usage; JOBS=$2; shift 2 ;;
    --tests) TESTS=1; shift ;;
    --memcheck) MEMCHECK=1; shift ;;
    --resume) RESUME=--resume; shift ;;
    --) shift; break ;;
    -h|--help) sed -n '2,14p' "$0"; exit 0 ;;
    *) usage ;;
  esac
done
[ -n "$OUT" ] || usage
mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd)
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1
python3 bench/environment.py torch triton fla-core >"$OUT/environment.txt"
cat "$OUT/environment.txt"
[ -n "$MEMCHECK" ] && python3 bench/gdn_memcheck.py >"$OUT/memcheck.log" 2>&1
if [ -n "$TESTS" ]; then
  (python3 -m pytest -q tests/test_gdn.py tests/test_gpu_faults.py -n 4 -p no:cacheprovider >"$OUT/tests.log" 2>&1
   echo "tests rc=$?" >>"$OUT/tests.log") &
fi
# -j 14 with seven entries: each entry's gates go to two workers at once (kgate run --help)
python3 -m kgate run fixtures/gdn/kgate.yaml --device cuda -j "$JOBS" --out "$OUT/kgate" \
  --json "$OUT/kgate/report.json" --junit "$OUT/kgate/junit.xml" $RESUME "$@" >"$OUT/kgate.log" 2>&1
rc=$?
echo "kgate rc=$rc" >>"$OUT/kgate.log"
wait
[ -n "$MEMCHECK" ] && cat "$OUT/memcheck.log"
[ -n "$TESTS" ] && tail -3 "$OUT/tests.log"
tail -n 40 "$OUT/kgate.log"
exit "$rc"
