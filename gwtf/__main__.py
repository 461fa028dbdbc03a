"""`python -m gwtf`: the same as the `gwtf` command."""

import sys

from gwtf.cli import main

if __name__ == "__main__":
    sys.exit(main())
