"""Quantity parsing must match Kubernetes exactly, or Bindery and the RM disagree about capacity."""

from __future__ import annotations

from decimal import Decimal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bindery.quantity import (
    MAX_QUANTITY,
    QuantityError,
    format_quantity,
    parse_nonnegative_quantity,
    parse_quantity,
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("100m", "0.1"),
        ("1", "1"),
        ("0", "0"),
        ("0.5", "0.5"),
        (".5", "0.5"),
        ("5.", "5"),
        ("+1", "1"),
        ("-1", "-1"),
        ("1Ki", "1024"),
        ("1Mi", str(1024**2)),
        ("1Gi", str(1024**3)),
        ("1.5Gi", str(3 * 1024**3 // 2)),
        ("1Ti", str(1024**4)),
        ("1Pi", str(1024**5)),
        ("1Ei", str(1024**6)),
        ("1k", "1000"),
        ("1M", "1000000"),
        ("1G", "1e9"),
        ("1T", "1e12"),
        ("1P", "1e15"),
        ("1E", "1e18"),
        ("1e3", "1000"),
        ("1E3", "1000"),
        ("1e+3", "1000"),
        ("1e-3", "0.001"),
        ("2e0", "2"),
        ("100n", "0.0000001"),
        ("1u", "0.000001"),
        ("0.1m", "0.0001"),
        # Finer than nano is rounded up, as Kubernetes does.
        ("0.1n", "0.000000001"),
        ("1e-12", "0.000000001"),
        ("-0.1n", "-0.000000001"),
        ("007", "7"),
    ],
)
def test_parses_like_kubernetes(text: str, expected: str) -> None:
    assert parse_quantity(text) == Decimal(expected)


def test_integers_are_accepted() -> None:
    assert parse_quantity(4) == Decimal(4)


@pytest.mark.parametrize(
    "text",
    [
        "",
        " 1",
        "1 ",
        "1.5.3",
        "abc",
        "1Kb",
        "1ki",
        "1e",
        "1e1.5",
        "--1",
        "+-1",
        ".",
        "1 Gi",
        "0x10",
        "1KiB",
        "Gi",
        "1m1",
        "∞",
        "1_000",
        "nan",
        "inf",
        "1e3m",
    ],
)
def test_rejects_garbage(text: str) -> None:
    with pytest.raises(QuantityError, match=r"quantity|suffix"):
        parse_quantity(text)


@pytest.mark.parametrize("text", ["1e400", "1e19", "9Ei", "1e99999", "1e-99999999", "10E"])
def test_rejects_absurd_values_with_clear_message(text: str) -> None:
    with pytest.raises(QuantityError, match=r"out of range|absurd"):
        parse_quantity(text)


def test_max_int64_is_accepted() -> None:
    assert parse_quantity(str(MAX_QUANTITY)) == MAX_QUANTITY
    assert parse_quantity("7Ei") == 7 * 2**60


def test_rejects_booleans_and_other_types() -> None:
    with pytest.raises(QuantityError):
        parse_quantity(True)
    with pytest.raises(QuantityError):
        parse_quantity(1.5)  # type: ignore[arg-type]


def test_overlong_input_rejected() -> None:
    with pytest.raises(QuantityError, match="characters long"):
        parse_quantity("1" * 1000)


def test_nonnegative_rejects_negative_with_context() -> None:
    with pytest.raises(QuantityError, match="request for cpu: '-1' is negative"):
        parse_nonnegative_quantity("-1", what="request for cpu")
    assert parse_nonnegative_quantity("0") == 0
    assert parse_nonnegative_quantity("-0") == 0


def test_nonnegative_keeps_parse_error_context() -> None:
    with pytest.raises(QuantityError, match=r"request for memory: .*out of range"):
        parse_nonnegative_quantity("1e400", what="request for memory")


@pytest.mark.parametrize(
    ("amount", "text"),
    [
        ("0", "0"),
        ("1", "1"),
        ("1024", "1Ki"),
        (str(8 * 1024**3), "8Gi"),
        ("1000", "1000"),
        ("0.1", "100m"),
        ("0.0000001", "100n"),
        ("-0.5", "-500m"),
        ("1.5", "1500m"),
    ],
)
def test_format(amount: str, text: str) -> None:
    assert format_quantity(Decimal(amount)) == text


quantities = st.builds(
    lambda n, suffix: f"{format(n, 'f')}{suffix}",
    st.decimals(min_value=0, max_value=10**6, places=3, allow_nan=False, allow_infinity=False),
    st.sampled_from(["", "m", "k", "Ki", "Mi", "Gi", "M", "G", "e2", "e-2", "n", "u"]),
)


@given(quantities)
def test_format_round_trips(text: str) -> None:
    value = parse_quantity(text)
    assert parse_quantity(format_quantity(value)) == value
