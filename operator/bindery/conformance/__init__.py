"""The RM conformance kit: ``python -m bindery.conformance --url URL --token-file F``.

Importable too: :data:`CHECKS` lists the checks (:func:`checks_for` those of one contract version)
and :func:`run_checks` runs them, so a vendor can parametrize pytest over ``CHECKS`` (see
``tests/rm/test_conformance.py`` in the Bindery repo).
"""

from bindery.conformance.kit import (
    CHECKS,
    CONTRACT_VERSIONS,
    Check,
    ConformanceConfig,
    ConformanceFailure,
    Result,
    checks_for,
    run_checks,
)

__all__ = [
    "CHECKS",
    "CONTRACT_VERSIONS",
    "Check",
    "ConformanceConfig",
    "ConformanceFailure",
    "Result",
    "checks_for",
    "run_checks",
]
