from aiordma.cli import main

raise SystemExit(main())
