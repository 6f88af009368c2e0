from aioqueue._cli.main import main

raise SystemExit(main())
