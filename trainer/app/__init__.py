"""The application layer: the ``hetgmp`` command (one parser, a subcommand per job), the demo
and its report. Library modules never import it."""
