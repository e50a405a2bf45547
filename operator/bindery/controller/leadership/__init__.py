"""Leadership, in a room of its own: only the holder of a Lease schedules.

- :mod:`.rules`: the pure lease rules (observation, expiry, the renew deadline, the exit point);
- :mod:`.elector`: the Lease's I/O (acquire, renew, release);
- :mod:`.term`: the election loop, and how leading starts and stops (`on_started` / `on_stopped`);
- :mod:`.fence`: the Binder that sends nothing unless this replica holds the lease.
"""
