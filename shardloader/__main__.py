"""``python -m shardloader``: the same command line as the ``shardloader`` script."""

from .tools.cli import main

raise SystemExit(main())
