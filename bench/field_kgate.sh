#!/usr/bin/env bash
# kgate on the field libraries' GPU manifests (examples/field/<library>/kgate.yaml: Liger-Kernel, FlagGems,
# fla-core), the libraries judged side by side, each by its own `kgate run`, with the machine's description.
# Needs kgate installed (pip install -e '.[audit]'), a CUDA GPU and the pinned libraries
# (pip install --no-deps -r examples/field/<library>/requirements.txt for each).
#
#   bash bench/field_kgate.sh --out DIR [--jobs liger=4,flaggems=6,fla=2] [--time SECONDS] [--resume]
#                             [--libraries liger,flaggems,fla] [-- KGATE_RUN_ARGS...]
#
# Writes into DIR: environment.txt (GPU, driver, torch, Triton, the libraries' versions, kgate commit) and per
# library LIB.log and kgate's own output under DIR/LIB (results.jsonl, report.json, junit.xml, logs/).
# --time stops each library's run after SECONDS (what it judged stays in its results.jsonl); --resume
# continues DIR/LIB/results.jsonl of an earlier run: only the (kernel, gate) results it lacks are judged.
# Arguments after -- go to every `kgate run`, e.g. -- --dtype float32 --gate oracle.
set -u
usage() { echo "usage: bash bench/field_kgate.sh --out DIR [--jobs LIB=N,...] [--time S] [--resume] [--libraries L,...] [-- ARGS]" >&2; exit 2; }
OUT="" JOBS="liger=4,flaggems=6,fla=2" TIME="" RESUME="" LIBS="liger,flaggems,fla"
while [ $# -gt 0 ]; do
  case "$1" in
    --out) [ $# -ge 2 ] || usage; OUT=$2; shift 2 ;;
    --jobs) [ $# -ge 2 ] || usage; JOBS=$2; shift 2 ;;
    --time) [ $# -ge 2 ] || usage; TIME=$2; shift 2 ;;
    --resume) RESUME=--resume; shift ;;
    --libraries) [ $# -ge 2 ] || usage; LIBS=$2; shift 2 ;;
    --) shift; break ;;
    -h|--help) sed -n '2,15p' "$0"; exit 0 ;;
    *) usage ;;
  esac
done
[ -n "$OUT" ] || usage
mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd)
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1
jobs_of() {  # jobs_of LIB: its N in --jobs, else 2
  local pair
  for pair in ${JOBS//,/ }; do [ "${pair%%=*}" = "$1" ] && { echo "${pair#*=}"; return; }; done
  echo 2
}
python3 bench/environment.py torch triton liger-kernel flag-gems fla-core >"$OUT/environment.txt"
cat "$OUT/environment.txt"
for lib in ${LIBS//,/ }; do
  manifest=examples/field/$lib/kgate.yaml
  [ -f "$manifest" ] || { echo "no manifest $manifest" >&2; exit 2; }
  (
    limit=()
    [ -n "$TIME" ] && limit=(timeout "$TIME")
    "${limit[@]}" python3 -m kgate run "$manifest" --device cuda -j "$(jobs_of "$lib")" --out "$OUT/$lib" \
      --json "$OUT/$lib/report.json" --junit "$OUT/$lib/junit.xml" $RESUME "$@" >"$OUT/$lib.log" 2>&1
    echo "$lib rc=$?" >>"$OUT/$lib.log"
  ) &
done
wait
for lib in ${LIBS//,/ }; do
  tail -n 1 "$OUT/$lib.log"
  [ -f "$OUT/$lib/results.jsonl" ] && echo "$lib: $(wc -l <"$OUT/$lib/results.jsonl") results"
done
