"""Run the command line as ``python -m ampkit.cli``."""

from ._main import main

if __name__ == "__main__":
    raise SystemExit(main())
