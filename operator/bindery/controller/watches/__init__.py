"""The operator's two pod watches, both on :func:`bindery.k8s.watching.list_watch`.

- :mod:`.unbound`: every pending pod (``spec.nodeName=``), the operator's hot path into the queues;
- :mod:`.bound`: per scheduler name, the pods this operator placed, so a pod that goes away gives its
  capacity back to the resource manager.
"""
