"""Errors a store raises at start-up that ``bindery rm serve`` reports as a reason, not a traceback.

Apart from the stores so that the command line can name them without importing a database driver.
"""

from __future__ import annotations

__all__ = ["SchemaTooNew"]


class SchemaTooNew(RuntimeError):
    """The database was migrated by a newer reference RM; this one would misread it."""
