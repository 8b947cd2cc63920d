#!/usr/bin/env bash
# Runs every stand-alone reproducer of the field findings (examples/field/<lib>/repro/*.py), one after the
# other, each under a time limit, and never stops at a failing one. A header names each script; its
# output follows, then its exit status. With --out DIR each script's output is also written to
# DIR/<lib>-<name>.txt, and DIR/summary.txt lists every script's status and its DEFECT lines.
#
#   bash examples/field/run_repros.sh [--out DIR] [--timeout SECONDS] [--python PYTHON] [PATTERN]
#
# PATTERN (a shell glob on "<lib>/<name>") selects scripts, e.g. 'flaggems/*' or '*/rms_norm*'.
# Most scripts need a CUDA GPU and the libraries (examples/field/*/requirements.txt); on a machine
# without one, the Liger scripts that Triton's interpreter can run set TRITON_INTERPRET=1 themselves.
set -u

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
out=""
limit=120
python="${PYTHON:-python}"
pattern="*"
while [ $# -gt 0 ]; do
    case "$1" in
        --out) out="$2"; shift 2 ;;
        --timeout) limit="$2"; shift 2 ;;
        --python) python="$2"; shift 2 ;;
        -h|--help) sed -n '2,11p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
        -*) echo "unknown option: $1" >&2; exit 2 ;;
        *) pattern="$1"; shift ;;
    esac
done
if [ -n "$out" ]; then
    mkdir -p "$out" || exit 2
    : > "$out/summary.txt"
fi

ran=0
failed=0
for script in "$here"/*/repro/*.py; do
    [ -e "$script" ] || continue
    lib="$(basename "$(dirname "$(dirname "$script")")")"
    name="$(basename "$script" .py)"
    # shellcheck disable=SC2053 - the pattern is a glob on purpose
    [[ "$lib/$name" == $pattern ]] || continue
    ran=$((ran + 1))
    log="$(mktemp)"
    echo "=================================================================="
    echo "== $lib/$name  ($(date -u +%Y-%m-%dT%H:%M:%SZ), limit ${limit}s)"
    echo "=================================================================="
    start=$(date +%s)
    (cd "$(dirname "$script")" && timeout --kill-after=10 "$limit" "$python" -u "$(basename "$script")") \
        > "$log" 2>&1
    status=$?
    seconds=$(( $(date +%s) - start ))
    cat "$log"
    case $status in
        0) verdict="exit 0" ;;
        124|137) verdict="TIMEOUT after ${limit}s"; failed=$((failed + 1)) ;;
        *) verdict="exit $status"; failed=$((failed + 1)) ;;
    esac
    defects=$(grep -c '^DEFECT' "$log")
    echo "-- $lib/$name: $verdict, ${seconds}s, $defects DEFECT line(s)"
    if [ -n "$out" ]; then
        { cat "$log"; echo "-- $verdict, ${seconds}s"; } > "$out/$lib-$name.txt"
        { echo "$lib/$name: $verdict, ${seconds}s, $defects DEFECT line(s)"
          grep '^DEFECT' "$log" | sed 's/^/    /'; } >> "$out/summary.txt"
    fi
    rm -f "$log"
done
echo "== $ran script(s) run, $failed did not exit 0"
