"""The Kopf wiring: watches, indexes, per-ResourceManager profiles and their worker tasks.

Kopf is used only for what writes nothing onto objects: `@kopf.on.event` handlers and
`@kopf.index`es. Pods are watched with the server-side field selector `spec.nodeName=` so the
operator holds unbound pods only; Nodes through an index of small projections; ResourceManagers
through events that rebuild profiles in place.
"""
