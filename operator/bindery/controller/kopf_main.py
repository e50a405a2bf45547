"""Entry module for `kopf run -m bindery.controller.kopf_main --all-namespaces --standalone`.

Registers Bindery's handlers on Kopf's default registry; options come from the environment
($KUBECONFIG or the in-cluster service account). `bindery run` is the supported way; this exists
for people who already run operators with `kopf run`.
"""

from __future__ import annotations

import kopf

from bindery.controller.startup.kopfwiring import register

register(registry=kopf.get_default_registry())
