from aioqueue._cli import main

raise SystemExit(main())
