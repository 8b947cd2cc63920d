#!/usr/bin/env bash
# One slice of the H200 audit of the yenhao-huang/KernelBench corpus (docs/audit/README.md says how
# to run it). Run on the device machine from the repository root, carrying .third_party/kb-corpus,
# .third_party/audit-run (the results so far; may be empty) and .whl-kgate. Each slice starts new
# candidates for BUDGET seconds (default 420), finishes those in flight, and leaves the results so far
# in $OUT/results.jsonl; exit 3 means candidates are left: bring results.jsonl back into
# .third_party/audit-run/ and run the slice again. Exit 0 or 1: every candidate is judged.
# `bash bench/audit_h200.sh throughput` runs bench/audit_throughput.py on LIMIT (24) candidates instead,
# spread evenly over the corpus in id order (SPREAD= (empty): the first LIMIT, as in session 12's run;
# those held 5 of the corpus's largest problems); its figures and every pass's records come back as
# $OUT/throughput.json and $OUT/throughput.records.jsonl, rewritten after each pass
# (MORE_JOBS=8: the full gates once more with 8 judges on the GPU; PRESTART=1: then each judge count again
# with `kgate audit --prestart`; TRITON=1: then the full gates again with the accumulation gate's Triton
# emulation, KGATE_TRITON_EMULATION=1, and any verdict that changed; OTHER_ORDER=1: then the full gates in id
# order, --order given, against the default longest-first; ORDER=given: id order first; GATES_ONLY=1: no
# standard-test pass; KEEP_CACHE=1: the builds an earlier call left in /tmp/kgate-bench, so that a later call
# on the same warm machine spends its 10 minutes judging).
# PCH= (empty) builds without the shared precompiled torch/extension.h (kgate audit --pch, on by default here).
set -uo pipefail
export PYTHONUNBUFFERED=1
BUDGET=${1:-420}
CORPUS=.third_party/kb-corpus
CARRIED=.third_party/audit-run
WORK=${KGATE_AUDIT_WORK:-/tmp/kgate-audit}  # stays while the machine is warm: the extension cache lives here
RESULTS_OUT=${OUT:-$CARRIED}

if ! PYTHONPATH=/tmp/site python3 -c "import pydantic, junit_xml, rich, yaml" 2>/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    .whl-kgate/*.whl || exit 2
fi
export PYTHONPATH=$PWD:/tmp/site${PYTHONPATH:+:$PYTHONPATH}

mkdir -p "$WORK" "$RESULTS_OUT"
if [ "$BUDGET" = "throughput" ]; then  # bash bench/audit_h200.sh throughput: the benchmark instead
  KEEP=()
  if [ -n "${REUSE_BUILDS:-}" ] && [ -d "$WORK/torch_extensions" ]; then  # the audit's builds: compile time not measured here
    mkdir -p /tmp/kgate-bench && ln -sfn "$WORK/torch_extensions" /tmp/kgate-bench/torch_extensions && KEEP=(--keep-cache)
  elif [ -n "${KEEP_CACHE:-}" ]; then  # an earlier call's builds on this (warm) machine: its compile pass finds them
    KEEP=(--keep-cache)
  fi
  python3 bench/audit_throughput.py "${KEEP[@]}" --problems "$CORPUS/problems" --candidates "$CORPUS/candidates" \
    --index "$CORPUS/index.csv" --device "${DEVICE:-cuda}" --jobs "${JOBS:-4}" --compile-jobs "${COMPILE_JOBS:-12}" \
    --timeout "${GATE_TIMEOUT:-120}" --limit "${LIMIT:-24}" ${SPREAD---spread} --out /tmp/kgate-bench --json "$RESULTS_OUT/throughput.json" \
    ${PCH---pch} ${MORE_JOBS:+--more-jobs "$MORE_JOBS"} ${PRESTART:+--prestart} ${TRITON:+--triton-emulation} ${OTHER_ORDER:+--other-order} \
    ${GATES_ONLY:+--gates-only} ${ORDER:+--order "$ORDER"}
  exit $?
fi
# The carried results are the truth unless this (warm) machine already holds more.
. bench/audit_carried.sh && take_carried "$WORK"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null
python3 -c "import torch, sys; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda)"

python3 -m kgate audit --format kernelbench \
  --problems "$CORPUS/problems" --candidates "$CORPUS/candidates" --index "$CORPUS/index.csv" \
  --device "${DEVICE:-cuda}" --jobs "${JOBS:-4}" --compile-jobs "${COMPILE_JOBS:-12}" --memory "${MEMORY:-24GiB}" \
  --timeout "${GATE_TIMEOUT:-120}" --compile-timeout 600 \
  --out "$WORK" --resume --max-time "$BUDGET" ${PCH---pch} ${SELECT:+-k "$SELECT"}
rc=$?
cp "$WORK/results.jsonl" "$RESULTS_OUT/results.jsonl"
echo "kgate audit exit code $rc; $(wc -l <"$RESULTS_OUT/results.jsonl") record(s) in $RESULTS_OUT/results.jsonl" \
  "($( [ $rc -eq 3 ] && echo 'more to do: carry them back and run again' || echo 'audit complete'))"
exit $rc
