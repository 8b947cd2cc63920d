#!/usr/bin/env bash
# kgate on the field libraries' GPU manifests (examples/field/<library>/kgate.yaml: Liger-Kernel, FlagGems,
# fla-core), the libraries judged one after another, each by its own `kgate run` with all the jobs, with the
# machine's description. One kgate at a time on the GPU: a `kgate run -j N` shares the GPU's memory out among
# its own N workers (and judges again alone what ran out of memory in its share), but separate `kgate run`
# processes side by side know nothing of each other, and one's workers would take the memory another's need.
# Needs kgate installed (pip install -e '.[audit]'), a CUDA GPU and the pinned libraries
# (pip install --no-deps -r examples/field/<library>/requirements.txt for each).
#
#   bash bench/field_kgate.sh --out DIR [--jobs N | --jobs liger=N,flaggems=N,fla=N] [--time SECONDS] [--resume]
#                             [--libraries liger,flaggems,fla] [-- KGATE_RUN_ARGS...]
#
# Writes into DIR: environment.txt (GPU, driver, torch, Triton, the libraries' versions, kgate commit) and per
# library LIB.log and kgate's own output under DIR/LIB (results.jsonl, report.json, junit.xml, logs/).
# --jobs: each library's `kgate run -j` (default 8; LIB=N for one library, the others keep the default).
# --time stops each library's run after SECONDS (what it judged stays in its results.jsonl; the libraries run
# one after another, so the whole run takes up to the libraries times SECONDS); --resume continues
# DIR/LIB/results.jsonl of an earlier run: only the (kernel, gate) results it lacks are judged.
# Arguments after -- go to every `kgate run`, e.g. -- --dtype float32 --gate oracle, or -- --cache DIR (a folder
# outside DIR that stays between runs: a --resume run then reuses the kernels' Triton builds and autotuning,
# which a chunked fla kernel otherwise spends minutes on in its first worker).
set -u
usage() { echo "usage: bash bench/field_kgate.sh --out DIR [--jobs N|LIB=N,...] [--time S] [--resume] [--libraries L,...] [-- ARGS]" >&2; exit 2; }
OUT="" JOBS=8 TIME="" RESUME="" LIBS="liger,flaggems,fla"
while [ $# -gt 0 ]; do
  case "$1" in
    --out) [ $# -ge 2 ] || usage; OUT=$2; shift 2 ;;
    --jobs) [ $# -ge 2 ] || usage; JOBS=$2; shift 2 ;;
    --time) [ $# -ge 2 ] || usage; TIME=$2; shift 2 ;;
    --resume) RESUME=--resume; shift ;;
    --libraries) [ $# -ge 2 ] || usage; LIBS=$2; shift 2 ;;
    --) shift; break ;;
    -h|--help) sed -n '2,21p' "$0"; exit 0 ;;
    *) usage ;;
  esac
done
[ -n "$OUT" ] || usage
mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd)
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1
jobs_of() {  # jobs_of LIB: --jobs N, or its N in --jobs LIB=N,..., else 8
  local pair
  case "$JOBS" in *=*) ;; *) echo "$JOBS"; return ;; esac
  for pair in ${JOBS//,/ }; do [ "${pair%%=*}" = "$1" ] && { echo "${pair#*=}"; return; }; done
  echo 8
}
python3 bench/environment.py torch triton liger-kernel flag-gems fla-core >"$OUT/environment.txt"
cat "$OUT/environment.txt"
for lib in ${LIBS//,/ }; do
  [ -f "examples/field/$lib/kgate.yaml" ] || { echo "no manifest examples/field/$lib/kgate.yaml" >&2; exit 2; }
done
for lib in ${LIBS//,/ }; do  # one after another: one kgate at a time on the GPU (see above)
  limit=()
  [ -n "$TIME" ] && limit=(timeout "$TIME")
  "${limit[@]}" python3 -m kgate run "examples/field/$lib/kgate.yaml" --device cuda -j "$(jobs_of "$lib")" \
    --out "$OUT/$lib" --json "$OUT/$lib/report.json" --junit "$OUT/$lib/junit.xml" $RESUME "$@" >"$OUT/$lib.log" 2>&1
  echo "$lib rc=$?" >>"$OUT/$lib.log"
  tail -n 1 "$OUT/$lib.log"
done
for lib in ${LIBS//,/ }; do  # (each library's kgate exit code is the last line of its LIB.log)
  if [ -f "$OUT/$lib/results.jsonl" ]; then echo "$lib: $(wc -l <"$OUT/$lib/results.jsonl") results"; else echo "$lib: no results"; fi
done
