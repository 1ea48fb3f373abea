"""`python -m research COMMAND ...` (see research/cli.py)."""

from research.cli import main

raise SystemExit(main())
