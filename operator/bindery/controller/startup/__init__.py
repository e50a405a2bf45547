"""The operator process: its entry, the Kopf wiring, its options, the install of the CRD and RBAC,
and the runtime that holds the clients, ports, leadership and one supervisor per ResourceManager.
What runs per ResourceManager is :mod:`bindery.controller.profile`."""
