"""Number formatting shared by every table: SI prefixes, GiB, milliseconds, hours, percentages."""

from __future__ import annotations


def si(value: float | None, unit: str = "", digits: int = 3) -> str:
    """Human-readable SI number: 8.21e9 -> '8.21 G'."""
    if value is None:
        return "-"
    for factor, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= factor:
            return f"{value / factor:.{digits}g} {prefix}{unit}"
    return f"{value:.{digits}g} {unit}".rstrip()


def gib(nbytes: float | None) -> str:
    return "-" if nbytes is None else f"{nbytes / 2**30:.2f} GiB"


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:.2f} ms"


def num(value: float | None, scale: float = 1.0) -> str:
    """``value / scale`` in %g form, or '-' when unknown."""
    return "-" if value is None else f"{value / scale:g}"


def hours(seconds: float | None) -> str:
    """Seconds as hours, without the unit (the column header carries it); '-' when unknown (None or NaN)."""
    return "-" if seconds is None or seconds != seconds else f"{seconds / 3600:.2f}"


def pct(value: float | None, fmt: str = ".0%") -> str:
    """A fraction as a percentage, '-' when unknown (None or NaN)."""
    return "-" if value is None or value != value else format(value, fmt)


def signed_pct(value: float | None) -> str:
    """A gain as a signed percentage (+12%), '-' when unknown."""
    return pct(value, "+.0%")


def ratio(value: float | None) -> str:
    """A ratio such as x bound (1.23), '-' when unknown or infinite."""
    return "-" if value is None or value != value or value == float("inf") else f"{value:.2f}"
