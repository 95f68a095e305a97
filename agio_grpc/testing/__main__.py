"""`python -m agio_grpc.testing`: run the fake model until interrupted (see `cli.py`)."""

from agio_grpc.testing.cli import main

raise SystemExit(main())
