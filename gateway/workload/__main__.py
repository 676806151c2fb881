from gateway.workload.export import main

raise SystemExit(main())
