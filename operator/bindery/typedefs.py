"""Type aliases shared by every room (as Kopf keeps its own in one `typedefs` module).

It sits below every room and imports nothing of Bindery's, so the raw apiserver layer can use it.
"""

from __future__ import annotations

import logging
from typing import TypeAlias

__all__ = ["Logger"]

#: What Bindery logs to: a module's logger, or one wrapped with a pod's or a ResourceManager's
#: context (:mod:`bindery.logcontext`).
Logger: TypeAlias = logging.Logger | logging.LoggerAdapter[logging.Logger]
