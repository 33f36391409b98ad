"""The ``ampkit`` command line: one module per subcommand, wired together in :mod:`ampkit.cli._main`."""
