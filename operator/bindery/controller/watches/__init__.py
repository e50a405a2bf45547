"""The operator's two pod watches, both on :func:`bindery.apiserver.watching.list_watch`.

- :mod:`.unbound`: the pending pods (``spec.nodeName=``) of each claimed scheduler name, the
  operator's hot path into the queues;
- :mod:`.placed`: every pod on a node (``spec.nodeName!=``), one list/watch per scope, for the
  inter-pod rules' cache and, through :mod:`.bound`, for each profile: a pod it placed that goes
  away gives its capacity back to the resource manager. (That used to be a second watch per
  scheduler name, whose events the first one received as well.)

Beside them :mod:`.namespaces` and :mod:`.services` follow namespace labels and Services.
"""
