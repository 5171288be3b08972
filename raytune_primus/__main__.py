from raytune_primus.cli import main

raise SystemExit(main())
