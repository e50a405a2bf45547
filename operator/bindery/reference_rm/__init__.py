"""The reference resource manager: the embedded default RM for the demo and chart, and a real server
in tests.  Install with ``pip install kube-bindery[rm]``; run with ``bindery rm serve`` or
:func:`serve_reference_rm` in-process."""

from bindery.reference_rm.placement import InventoryNode, Policy
from bindery.reference_rm.server import ReferenceRM, RunningServer, serve_reference_rm

__all__ = ["InventoryNode", "Policy", "ReferenceRM", "RunningServer", "serve_reference_rm"]
