"""`python -m bindery ...` is the same as the `bindery` console script."""

import sys

from bindery.cli import main

sys.exit(main())
