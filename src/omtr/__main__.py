from omtr.cli import main

raise SystemExit(main())
