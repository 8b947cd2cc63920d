from kgate.cli import main

raise SystemExit(main())
