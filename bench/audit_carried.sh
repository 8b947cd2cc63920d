# Sourced by bench/audit_bg.sh and bench/audit_h200.sh (from the repository root): the audit records a
# device call starts from. Two places may hold them: .third_party/audit-run/results.jsonl (ignored, carried:
# what the last call brought back) and docs/audit/results.jsonl (committed, so a new checkout, whose
# ignored folders are empty, loses nothing). The one with more records wins, unless the (warm) machine's
# own work folder already holds more.
take_carried() {  # take_carried WORK
  local best="" n=0 f c
  for f in .third_party/audit-run/results.jsonl docs/audit/results.jsonl; do
    [ -s "$f" ] || continue
    c=$(wc -l <"$f")
    if [ "$c" -gt "$n" ]; then best=$f; n=$c; fi
  done
  if [ -n "$best" ] && [ "$n" -gt "$(cat "$1/results.jsonl" 2>/dev/null | wc -l)" ]; then
    cp "$best" "$1/results.jsonl" && echo "resuming from $best ($n record(s))"
  fi
}
