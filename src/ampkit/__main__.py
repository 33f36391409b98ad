"""Run the command line as ``python -m ampkit``."""

from .cli._main import main

if __name__ == "__main__":
    raise SystemExit(main())
