#!/usr/bin/env bash
# The H200 audit (docs/audit/README.md) as one background job that runs on across device calls: a
# process in its own session outlives the call that started it, for as long as the machine stays warm
# (30 s after a call, so the next call must follow at once). Each call collects what is done so far;
# bring $OUT/results.jsonl back into .third_party/audit-run/ so that a fresh machine can `--resume`
# with bench/audit_h200.sh if this one is given back.
#
#   bash bench/audit_bg.sh start   copy kgate and the corpus to /tmp/kgate-src, build every extension
#                                  (compile-only, nice 19, BUILD_JOBS at once), then wait for `go`
#                                  (NO_PREBUILD=1: no separate build pass; the audit builds and judges at once,
#                                  handing each candidate to the GPU as soon as its build is done)
#   bash bench/audit_bg.sh go      let the judging start (the GPU is free for it); builds not done by then
#                                  are made by the audit itself as it judges
#   bash bench/audit_bg.sh collect [WAIT_S]   wait up to WAIT_S (default 0) for the audit to end, then copy
#                                  results.jsonl, driver.log and the audit's output into $OUT; no waiting when
#                                  no driver runs (exit 3 when this machine never had one: a fresh machine)
#   Each device call is best `start; collect WAIT_S`: `start` on the warm machine only says the driver runs,
#   and on a fresh one (the warm one given back between calls) resumes from the carried results
#   bash bench/audit_bg.sh stop    end the audit now (finished records kept; `collect` after it), freeing
#                                  the machine for a measurement
#
# DEVICE (default cuda), JOBS (4), BUILD_JOBS (8), MEMORY (24GiB), GATE_TIMEOUT (120 s), NICE (0: the audit's
# priority, e.g. 10 while another job shares the machine), PCH (default --pch: one precompiled torch/extension.h
# for every build; PCH= builds without it), REJUDGE (=1: --rejudge-stale, judge again the records another kgate
# made, once the rest is done), SELECT (a `-k` expression: only those candidates, e.g. with REJUDGE=1 to judge
# chosen records again), KEEP_SOURCE (with REJUDGE=1: kgate source digests whose records are kept, --keep-source)
# tune it; CORPUS_FROM
# (default .third_party/kb-corpus) names another corpus; KGATE_AUDIT_WORK, KGATE_AUDIT_SRC, KGATE_SITE move the
# work folder, the copy the driver runs and the installed dependencies (defaults under /tmp); THEN (a command, run from this checkout once the
# audit has ended, with OUT set to a folder whose files `collect` brings back as then-*: e.g. the throughput
# benchmark, THEN="bash bench/audit_h200.sh throughput"); FIRST (the same, run before the audit and its builds,
# on the quiet machine, its files brought back as first-*: a measurement that must not wait for a long
# audit); KGATE_FROM (default: this checkout) a folder holding the
# kgate/ package to judge with, so that an audit joined across sessions is judged by one kgate although kgate
# changed in between: `git archive COMMIT kgate | tar -x -C .third_party/kgate-audit`, carried, and
# KGATE_FROM=.third_party/kgate-audit (every record names the kgate source digest that made it). Carry .third_party/kb-corpus, .third_party/audit-run (may be empty) and .whl-kgate.
set -u
WORK=${KGATE_AUDIT_WORK:-/tmp/kgate-audit}
SRC=${KGATE_AUDIT_SRC:-/tmp/kgate-src}  # kgate, bench and the corpus as the driver runs them
SITE=${KGATE_SITE:-/tmp/site}  # the dependencies the device machine lacks, installed from the carried wheels
CORPUS=$SRC/kb-corpus
cmd=${1:-}

# Whether process $1 runs: a finished driver nobody reaps (no init that waits in some containers) stays a
# zombie, which `kill -0` still finds
alive() { [ -r "/proc/$1/stat" ] && [ "$(sed 's/.*) //' "/proc/$1/stat" | cut -d' ' -f1)" != Z ]; }

# aside NAME COMMAND: run COMMAND (FIRST or THEN) from the checkout, with OUT=$WORK/NAME, whose files
# `collect` brings back as NAME-*; its output in $WORK/NAME/NAME.log
aside() {
  mkdir -p "$WORK/$1"
  echo "$1: start $(date -u +%T): $2"
  (cd "$REPO" && OUT="$WORK/$1" PYTHONPATH="$REPO:$SITE" bash -c "$2") >"$WORK/$1/$1.log" 2>&1
  echo "$1: rc=$? at $(date -u +%T)"
}

AUDIT=(python3 -m kgate audit --format kernelbench --problems "$CORPUS/problems" --candidates "$CORPUS/candidates"
       --device "${DEVICE:-cuda}" --compile-timeout 600 --out "$WORK" ${PCH---pch})
[ -f "$CORPUS/index.csv" ] && AUDIT+=(--index "$CORPUS/index.csv")
[ -n "${SELECT:-}" ] && AUDIT+=(-k "$SELECT")

case "$cmd" in
start)
  mkdir -p "$WORK"
  if [ -f "$WORK/driver.pid" ] && alive "$(cat "$WORK/driver.pid")"; then
    echo "audit driver already running (pid $(cat "$WORK/driver.pid"))"; exit 0
  fi
  if ! PYTHONPATH=$SITE python3 -c "import pydantic, junit_xml, rich, yaml" 2>/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" \
      .whl-kgate/*.whl || exit 2
  fi
  kgate_from=${KGATE_FROM:-.}
  [ -f "$kgate_from/kgate/__init__.py" ] || { echo "KGATE_FROM=$kgate_from holds no kgate/ package" >&2; exit 2; }
  rm -rf "$SRC" && mkdir -p "$SRC" && cp -r "$kgate_from/kgate" bench "$SRC/" \
    && cp -r "${CORPUS_FROM:-.third_party/kb-corpus}" "$CORPUS" || exit 2
  # the carried results are the truth unless this (warm) machine already holds more
  . bench/audit_carried.sh && take_carried "$WORK"
  rm -rf "$WORK/GO" "$WORK/DONE" "$WORK/then" "$WORK/first"
  [ -n "${NO_PREBUILD:-}" ] && touch "$WORK/GO"
  # `cd` apart from the `&`: then $! is setsid itself, which (not a group leader here) does not fork, so
  # driver.pid is the driver's session and process group, the one `stop` signals
  (cd "$SRC" || exit 2
   REPO=$OLDPWD PYTHONPATH=$SITE:$SRC setsid nohup bash "$SRC/bench/audit_bg.sh" _drive >"$WORK/driver.log" 2>&1 </dev/null &
   echo $! >"$WORK/driver.pid")
  echo "audit driver started (pid $(cat "$WORK/driver.pid")); building extensions"
  ;;
_drive)
  export PYTHONUNBUFFERED=1
  [ -n "${FIRST:-}" ] && aside first "$FIRST"
  t0=$(date +%s)
  if [ -z "${NO_PREBUILD:-}" ]; then
    echo "compile-only: start $(date -u +%T)"
    # --resume: the candidates already judged need no build (REJUDGE: they are judged again, so they do)
    skip=(--resume); [ -n "${REJUDGE:-}" ] && skip=()
    nice -n 19 "${AUDIT[@]}" --compile-only "${skip[@]}" --compile-jobs "${BUILD_JOBS:-8}" -q &
    cpid=$!
    while kill -0 "$cpid" 2>/dev/null && [ ! -f "$WORK/GO" ]; do sleep 2; done
    # `go` before every build is done: stop the builds in flight (kgate kills them on SIGTERM; their
    # locks are cleared before the audit builds them again) and let the audit build the rest as it judges
    kill -0 "$cpid" 2>/dev/null && kill -TERM "$cpid"
    wait "$cpid"
    echo "compile-only: rc=$? after $(( $(date +%s) - t0 )) s"
  fi
  while [ ! -f "$WORK/GO" ]; do sleep 2; done
  t1=$(date +%s)
  echo "audit: start $(date -u +%T)"
  keep=(); [ -n "${REJUDGE:-}" ] && for d in ${KEEP_SOURCE:-}; do keep+=(--keep-source "$d"); done
  nice -n "${NICE:-0}" "${AUDIT[@]}" --resume ${REJUDGE:+--rejudge-stale} ${keep[@]+"${keep[@]}"} --jobs "${JOBS:-4}" --compile-jobs "${BUILD_JOBS:-8}" --memory "${MEMORY:-24GiB}" \
    --timeout "${GATE_TIMEOUT:-120}" -q --json "$WORK/audit.json"
  echo "audit: rc=$? after $(( $(date +%s) - t1 )) s"
  # what follows the audit on the same (now quiet) machine, e.g. the throughput benchmark
  [ -n "${THEN:-}" ] && aside then "$THEN"
  touch "$WORK/DONE"
  ;;
go)
  touch "$WORK/GO" && echo "audit: judging may start"
  ;;
stop)
  # the driver's whole session (it was started with setsid): kgate cancels on SIGTERM, keeps every finished
  # record and leaves the candidates in flight to --resume; then the GPU is free (e.g. for timing)
  if [ -f "$WORK/driver.pid" ] && alive "$(cat "$WORK/driver.pid")"; then
    kill -TERM -- -"$(cat "$WORK/driver.pid")" 2>/dev/null
    for _ in $(seq 60); do alive "$(cat "$WORK/driver.pid")" || break; sleep 1; done
    kill -KILL -- -"$(cat "$WORK/driver.pid")" 2>/dev/null
  fi
  echo "audit: stopped; $(cat "$WORK/results.jsonl" 2>/dev/null | wc -l) record(s) kept"
  ;;
collect)
  wait_s=${2:-0}
  end=$(( $(date +%s) + wait_s ))
  driving() { [ -f "$WORK/driver.pid" ] && alive "$(cat "$WORK/driver.pid")"; }
  if [ ! -f "$WORK/DONE" ] && ! driving; then
    # nothing to wait for: a fresh machine (the warm one was given back between calls, and this one has no
    # audit), or a driver that died without finishing; waiting would only spend the lease
    if [ -f "$WORK/driver.pid" ]; then
      echo "audit: the driver (pid $(cat "$WORK/driver.pid")) ended without finishing; see audit-driver.log"
    else
      echo "audit: no audit on this machine (a fresh one?); 'start' again resumes from the carried results" >&2
      exit 3
    fi
  fi
  while [ ! -f "$WORK/DONE" ] && driving && [ "$(date +%s)" -lt "$end" ]; do sleep 5; done
  dest=${OUT:-.}
  for f in results.jsonl driver.log audit.json; do [ -f "$WORK/$f" ] && cp "$WORK/$f" "$dest/audit-$f"; done
  for side in first then; do
    for f in "$WORK/$side"/*; do [ -f "$f" ] && cp "$f" "$dest/$side-$(basename "$f")"; done
  done
  echo "audit: $(cat "$WORK/results.jsonl" 2>/dev/null | wc -l) record(s); $( [ -f "$WORK/DONE" ] && echo done || echo running)"
  tail -5 "$WORK/driver.log" 2>/dev/null || true
  ;;
*)
  echo "usage: bash bench/audit_bg.sh start|go|stop|collect [WAIT_S]" >&2; exit 2
  ;;
esac
