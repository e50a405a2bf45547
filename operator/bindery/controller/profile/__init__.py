"""One ResourceManager's profile as the process runs it: its supervisor (credentials, probe,
status), its runner (queue, workers, bound-pod subscription) and the pending pods routed to it."""
