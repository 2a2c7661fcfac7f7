from tdyn.cli import main

raise SystemExit(main())
