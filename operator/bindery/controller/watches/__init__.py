"""The operator's two pod watches, both on :func:`bindery.k8s.watching.list_watch`.

- :mod:`.unbound`: the pending pods (``spec.nodeName=``) of each claimed scheduler name, the
  operator's hot path into the queues;
- :mod:`.bound`: per scheduler name, the pods this operator placed, so a pod that goes away gives its
  capacity back to the resource manager.
"""
