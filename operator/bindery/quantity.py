"""Kubernetes resource quantities, parsed the way the apiserver parses them.

Bindery and every resource manager must agree on what ``"100m"`` or ``"1Gi"`` means, or capacity
leaks silently.  This module implements the grammar of ``k8s.io/apimachinery/pkg/api/resource``::

    <quantity>      ::= <signedNumber><suffix>
    <signedNumber>  ::= <sign><numericValue> | <numericValue>
    <numericValue>  ::= <digits> | <digits>.<digits> | <digits>. | .<digits>
    <suffix>        ::= <binarySI> | <decimalExponent> | <decimalSI>
    <binarySI>      ::= Ki | Mi | Gi | Ti | Pi | Ei
    <decimalSI>     ::= n | u | m | "" | k | M | G | T | P | E
    <decimalExponent> ::= "e" <signedInteger> | "E" <signedInteger>

Like Kubernetes, precision finer than a nano-unit is rounded up (away from zero).  Unlike Kubernetes,
which silently clamps values above the int64 range, we reject them: a request of ``memory: 1e400`` is a
mistake, and clamping it would turn it into a plausible-looking huge number.

Values are ``decimal.Decimal`` so arithmetic on them (sum of requests, allocatable minus reserved) is
exact.  All arithmetic here runs in a local context with enough precision for the allowed range.
"""

from __future__ import annotations

import decimal
import functools
import re
from decimal import Decimal

__all__ = [
    "MAX_QUANTITY",
    "QuantityError",
    "format_quantity",
    "parse_nonnegative_quantity",
    "parse_quantity",
]


class QuantityError(ValueError):
    """A string is not a valid Kubernetes quantity, or is outside the range we accept."""


#: The largest magnitude Kubernetes can represent as an int64 (``Quantity.Value()``).
MAX_QUANTITY = Decimal(2**63 - 1)

# Enough digits for int64 integers plus nine fractional digits, with room to spare.
_CONTEXT = decimal.Context(prec=60, rounding=decimal.ROUND_UP, Emax=99_999, Emin=-99_999)

_NUMBER = re.compile(r"^([+-]?)([0-9]+(?:\.[0-9]*)?|\.[0-9]+)(.*)$")
_EXPONENT = re.compile(r"^[eE]([+-]?[0-9]+)$")

_DECIMAL_SI: dict[str, int] = {
    "n": -9,
    "u": -6,
    "m": -3,
    "": 0,
    "k": 3,
    "M": 6,
    "G": 9,
    "T": 12,
    "P": 15,
    "E": 18,
}
_BINARY_SI: dict[str, int] = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}
_NANO = Decimal("1e-9")
# An exponent beyond this cannot produce a value inside MAX_QUANTITY (or above nano precision),
# so we refuse it before building a huge Decimal.
_MAX_EXPONENT_DIGITS = 4
_MAX_INPUT_LENGTH = 256


def _multiplier(suffix: str, original: str) -> Decimal:
    """The factor a suffix stands for; raises QuantityError for an unknown suffix."""
    if suffix in _DECIMAL_SI:
        return Decimal(10) ** _DECIMAL_SI[suffix]
    if suffix in _BINARY_SI:
        return Decimal(2) ** _BINARY_SI[suffix]
    exponent = _EXPONENT.match(suffix)
    if exponent is None:
        raise QuantityError(
            f"quantity {original!r} has an unknown suffix {suffix!r}: use one of "
            "n u m k M G T P E, Ki Mi Gi Ti Pi Ei, or an exponent like e3"
        )
    digits = exponent.group(1).lstrip("+-").lstrip("0")
    if len(digits) > _MAX_EXPONENT_DIGITS:
        raise QuantityError(
            f"quantity {original!r} is out of range: its exponent is absurd; "
            f"quantities must not exceed {MAX_QUANTITY} in magnitude"
        )
    return Decimal(10) ** int(exponent.group(1))


def parse_quantity(value: str | int) -> Decimal:
    """Parse a Kubernetes quantity (``"100m"``, ``"1Gi"``, ``"1e3"``, ``"0.5"``, ``5``) exactly.

    Raises QuantityError (a ValueError) with a message saying what was wrong.  Negative values are
    allowed here, as in Kubernetes; use :func:`parse_nonnegative_quantity` for requests and capacity.

    Strings are remembered (the last few thousand): a cluster's pods repeat a handful of quantities,
    and every pod's requests are parsed by the operator and again by the reference RM, where the
    regular expression and the decimal context cost more than the rest of reading the pod.
    """
    if type(value) is str:
        return _parse_string(value)
    return _parse(value)


@functools.lru_cache(maxsize=4096)
def _parse_string(value: str) -> Decimal:
    return _parse(value)  # a QuantityError is raised again each time, not remembered


def _parse(value: str | int) -> Decimal:
    if isinstance(value, bool):
        raise QuantityError(f"quantity must be a string or an integer, not a boolean ({value!r})")
    if isinstance(value, int):
        result = Decimal(value)
        return _check_range(result, str(value))
    if not isinstance(value, str):
        raise QuantityError(f"quantity must be a string or an integer, not {type(value).__name__}")
    if len(value) > _MAX_INPUT_LENGTH:
        raise QuantityError(
            f"quantity is {len(value)} characters long; at most {_MAX_INPUT_LENGTH} are allowed"
        )
    match = _NUMBER.match(value)
    if match is None:
        raise QuantityError(
            f"{value!r} is not a Kubernetes quantity: expected a number with an optional suffix, "
            "e.g. '100m', '1Gi', '1e3' or '0.5'"
        )
    sign, number, suffix = match.groups()
    with decimal.localcontext(_CONTEXT):
        result = Decimal(number) * _multiplier(suffix, value)
        if sign == "-":
            result = -result
        _check_range(result, value)
        # Kubernetes keeps at most nano precision and rounds up (away from zero).
        return result.quantize(_NANO, rounding=decimal.ROUND_UP)


def _check_range(result: Decimal, original: str) -> Decimal:
    if abs(result) > MAX_QUANTITY:
        raise QuantityError(
            f"quantity {original!r} is out of range: its magnitude must not exceed {MAX_QUANTITY} "
            "(the largest value Kubernetes can represent)"
        )
    return result


def parse_nonnegative_quantity(value: str | int, *, what: str = "quantity") -> Decimal:
    """Parse a quantity that must be zero or positive, such as a resource request or capacity.

    ``what`` names the value in the error message, e.g. ``"request for cpu"``.
    """
    try:
        result = parse_quantity(value)
    except QuantityError as error:
        raise QuantityError(f"{what}: {error}") from None
    if result < 0:
        raise QuantityError(f"{what}: {value!r} is negative; it must be zero or positive")
    return result


def _strip(number: Decimal) -> str:
    """A Decimal as plain digits with no exponent and no trailing fractional zeros."""
    text = format(number, "f")
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return text


@functools.lru_cache(maxsize=4096, typed=True)  # typed: True and 1.0 are not Decimal(1)
def format_quantity(amount: Decimal) -> str:
    """A short string for ``amount`` that parses back to exactly the same value.

    Whole multiples of 1024 use binary suffixes (``"8Gi"``), other whole numbers are plain digits,
    fractions use ``m`` or ``n`` when exact and a plain decimal otherwise. Equal amounts give the
    same string, so the last few thousand are remembered (as :func:`parse_quantity`'s strings).
    """
    with decimal.localcontext(_CONTEXT):
        if amount == amount.to_integral_value():
            whole = int(amount)
            if whole != 0:
                for suffix, power in sorted(_BINARY_SI.items(), key=lambda item: -item[1]):
                    if whole % (1 << power) == 0:
                        return f"{whole >> power}{suffix}"
            return str(whole)
        milli = amount * 1000
        if milli == milli.to_integral_value():
            return f"{int(milli)}m"
        nano = amount * 1_000_000_000
        if nano == nano.to_integral_value():
            return f"{int(nano)}n"
        return _strip(amount)
