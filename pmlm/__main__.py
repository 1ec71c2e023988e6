from pmlm.cli import main

raise SystemExit(main())
