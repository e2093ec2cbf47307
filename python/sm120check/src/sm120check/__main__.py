from sm120check.cli import main

raise SystemExit(main())
