"""Trainer processes and the ``hetgmp`` command line (the one package that imports the others)."""

__all__: list[str] = []
