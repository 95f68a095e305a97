"""`python -m agio_grpc.cli`: the `agio-grpc` command."""

from agio_grpc.cli import main

raise SystemExit(main())
