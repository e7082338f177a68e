"""`python -m tailrace_services.capture PIPELINE.yaml`: the same as `tailrace-capture`."""

from tailrace_services.capture.main import main

raise SystemExit(main())
