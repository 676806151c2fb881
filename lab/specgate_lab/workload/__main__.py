from specgate_lab.workload.export import main

raise SystemExit(main())
