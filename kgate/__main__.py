from kgate.cli import entry

raise SystemExit(entry())
