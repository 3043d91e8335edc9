"""``python -m hetgmp``: the ``hetgmp`` command."""

from hetgmp.trainer.app.cli import main

raise SystemExit(main())
