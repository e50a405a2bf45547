"""The pure core of Bindery's binding pipeline: queue, framework, cycle and decisions.

Nothing in this package talks to Kubernetes or to a resource manager directly.  It calls the ports
in :mod:`bindery.scheduling.ports` (implemented against the apiserver by :mod:`bindery.adapters`) and a
resource-manager client (:class:`bindery.rm.client.ResourceManagerClient`, or anything shaped like
:class:`bindery.scheduling.framework.ReservationClient`).  That keeps every decision the scheduler
makes (what to retry, what to release, what to tell the user) testable without a cluster.

Modules, in dependency order:

* ``ports``: what the core needs from the cluster (lookups from watch caches, three writers).
* ``podspec``: :class:`PodInfo` from a pod body, effective requests, the RM reservation request.
* ``nodecheck``: the pre-bind checks of the RM's node, per ``spec.nodeCheck``.
* ``decisions``: failure → release / report / reason / requeue, as a table.
* ``framework``: extension-point interfaces, :class:`Status`, :class:`Profile`, :class:`CycleContext`.
* ``defaults``: the built-in steps as default plugins.
* ``registry``: plugins by name (registered objects or ``bindery.plugins`` entry points).
* ``throttle``: rate-limiting of repeated FailedScheduling events.
* ``cycle``: :func:`schedule_one`, one binding cycle.
* ``queue``: :class:`SchedulingQueue`, one per ResourceManager.

Import the modules directly (``from bindery.scheduling.cycle import schedule_one``); this package
deliberately re-exports nothing, so importing one module never drags in the others.
"""
