"""A reservation's after-life: what becomes of it once a cycle made it, until the RM forgets it.

:mod:`.fate` decides, purely, what a reservation becomes given its pod; the rest read the pods and
act on it: :mod:`.unconfirmed` (a Binding that got no answer), :mod:`.releases` (a bound pod that
went away), :mod:`.reconcile` (a pass over the RM's active reservations), :mod:`.restore` (a bound
pod whose reservation the RM lost) and :mod:`.revocation` (reservations the RM revoked).
:mod:`.boundpods` is the slim bound pod they all read. Nothing here is imported by
:mod:`bindery.controller.rmstack` or :mod:`bindery.controller.watches`: the stack knows the
unconfirmed Bindings as its ``Settler`` protocol, and the watch hands pods over by its subscriber
protocol.
"""
