"""``python -m shardloader.launch``: see ``shardloader.launch``."""

import sys

from ._cli import main

if __name__ == "__main__":
    sys.exit(main())
