"""The operator process: start-up, the pending pods, one supervisor and one runner per ResourceManager.

Kopf runs only what writes nothing onto objects (start-up, login, the Node index, the
ResourceManager events: :mod:`.kopfwiring`); pods are followed by Bindery's own watches
(:mod:`.watches`). A pod event goes watch → :mod:`.profile.pending` (remember, route by scheduler name) →
:mod:`.profile.runner` (the ResourceManager's queue and workers) → :mod:`.attempt` (one cycle of
:func:`bindery.scheduling.cycle.schedule_one`, and what follows it); a pod of a PodGroup goes to
:mod:`.podgroups` instead. Every RM call goes through the runner's :mod:`.rmstack`; only the
holder of the Lease (:mod:`.leadership`) binds or releases. ARCHITECTURE.md draws the whole path.
"""
