"""Value sets the chart is rendered, linted and server-side dry-run applied with.

Each exercises a different branch of the templates; together they cover every template file.
"""

from __future__ import annotations

from typing import Any

VALUE_SETS: dict[str, dict[str, Any]] = {
    "defaults": {},
    # Nothing optional: no reference RM, no metrics, no policies, an existing ServiceAccount.
    "minimal": {
        "referenceRM": {"enabled": False},
        "metrics": {"enabled": False},
        "networkPolicy": {"enabled": False},
        "podDisruptionBudget": {"enabled": False},
        "serviceAccount": {"create": False, "name": "existing-operator-sa"},
        "rbac": {"create": False},
    },
    # Bring-your-own resource managers, Secrets in another namespace, a pinned image digest.
    "external-rms": {
        "referenceRM": {"enabled": False},
        "image": {"repository": "registry.example.com/bindery", "digest": "sha256:" + "ab" * 32},
        "imagePullSecrets": [{"name": "regcred"}],
        "rbac": {"secretNamespaces": ["default"]},
        "resourceManagers": [
            {
                "name": "gpu-pool",
                "spec": {
                    "schedulerNames": ["bindery-gpu"],
                    "endpoint": "https://rm.example.com",
                    "auth": {"tokenSecretRef": {"namespace": "default", "name": "gpu-rm-token"}},
                    "maxInFlight": 8,
                },
            },
            {
                "name": "batch",
                "annotations": {"example.com/owner": "batch-team"},
                "spec": {
                    "schedulerNames": ["bindery-batch", "batch"],
                    "endpoint": "https://batch-rm.example.com:8443",
                },
            },
        ],
        "operator": {
            "extraArgs": ["--verbose"],
            "extraEnv": [{"name": "EXAMPLE", "value": "1"}],
            "nodeSelector": {"kubernetes.io/os": "linux"},
            "tolerations": [
                {"key": "dedicated", "operator": "Equal", "value": "infra", "effect": "NoSchedule"}
            ],
            "podAnnotations": {"example.com/team": "platform"},
            "podLabels": {"example.com/tier": "control"},
        },
        "networkPolicy": {"metricsFrom": [{"namespaceSelector": {"matchLabels": {"name": "monitoring"}}}]},
        "podDisruptionBudget": {"maxUnavailable": "100%"},
        "flowSchema": {"enabled": True},
        "metrics": {"grafanaDashboard": {"enabled": True, "annotations": {"grafana_folder": "Bindery"}}},
    },
    # The reference RM tuned: its own Secret, no PVC, a node pool, two scheduler names.
    "reference-rm-tuned": {
        "fullnameOverride": "sched",
        "operator": {"healthPort": 9808},
        "metrics": {"port": 9809, "service": {"port": 9808}},
        "referenceRM": {
            "schedulerNames": ["bindery", "bindery-batch"],
            "mirrorNodeSelector": "bindery.dev/pool=default",
            "port": 9000,
            "token": {"existingSecret": "my-rm-token"},
            "persistence": {"enabled": False},
            "resourceManagerSpec": {"maxInFlight": 32, "nodeCheck": "Basic"},
            "extraArgs": ["--verbose"],
        },
        "networkPolicy": {
            "referenceRMFrom": [{"podSelector": {"matchLabels": {"app": "debug"}}}],
            "metricsOpen": True,
        },
    },
    # The reference RM on an external PostgreSQL: two active replicas, a PodDisruptionBudget, spread.
    "reference-rm-postgres": {
        "referenceRM": {
            "replicas": 2,
            "database": {
                "url": "postgresql://bindery_rm@db.example.com:5432/bindery?sslmode=verify-full"
                "&sslrootcert=/etc/bindery-rm/db-tls/ca.crt",
                "passwordSecret": {"name": "rm-db", "key": "password"},
                "tlsSecret": "rm-db-ca",
            },
        },
    },
}
