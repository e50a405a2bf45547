"""The pure core of Bindery's binding pipeline: queue, framework, cycle and decisions.

Nothing in this package talks to Kubernetes or to a resource manager directly.  It calls the ports
in :mod:`bindery.scheduling.ports` (implemented against the apiserver by :mod:`bindery.kube`) and a
resource-manager client (:class:`bindery.rm.client.ResourceManagerClient` or anything shaped like
:class:`bindery.scheduling.framework.ReservationClient`).  That keeps every decision the scheduler
makes (what to retry, what to release, what to tell the user) testable without a cluster.

Import the modules directly (``from bindery.scheduling.cycle import schedule_one``); this package
deliberately re-exports nothing, so importing one module never drags in the others.
"""
