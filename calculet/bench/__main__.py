"""``python -m calculet.bench``: run the command line of :mod:`calculet.bench.cli`."""

import sys

from calculet.bench.cli import main

if __name__ == "__main__":
    sys.exit(main())
