"""``python -m bindery.conformance``: see :mod:`bindery.conformance.cli`."""

import sys

from bindery.conformance.cli import main

sys.exit(main())
