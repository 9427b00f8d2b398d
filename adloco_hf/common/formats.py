"""The number formats every human-readable line shares (log lines, summaries, plots, model cards)."""

import math


__all__ = ["byte_unit", "format_bytes", "format_count", "format_duration"]


_BYTE_UNITS = (" B", " KiB", " MiB", " GiB", " TiB")


_COUNT_UNITS = ("", "K", "M", "B", "T")


def _number(value: float, exact: bool) -> str:
    """One decimal below 10, none from 10 on; an exact integer keeps all its digits."""
    if exact and float(value).is_integer():
        return str(int(value))
    return f"{value:.1f}".removesuffix(".0") if abs(value) < 10 else f"{value:.0f}"


def _scale(value: float, base: float, units: tuple[str, ...]) -> tuple[int, str]:
    """The exponent of `base` that `value` is written with, and the number written (before its unit).

    The unit is chosen after rounding, so 1023.99 KiB is written "1 MiB", not "1024 KiB".
    """
    exponent, scaled = 0, float(value)
    while abs(scaled) >= base and exponent < len(units) - 1:
        scaled /= base
        exponent += 1
    text = _number(scaled, exact=exponent == 0)
    if abs(float(text)) >= base and exponent < len(units) - 1:
        exponent += 1
        text = _number(scaled / base, exact=False)
    return exponent, text


def _human(value: float, units: tuple[str, ...], base: float) -> str:
    if not math.isfinite(value):
        return f"{value}{units[0]}"
    exponent, text = _scale(value, base, units)
    return f"{text}{units[exponent]}"


def format_bytes(n: float) -> str:
    """A size in binary units: 512 → "512 B", 1536 → "1.5 KiB", 7_769_856 → "7.4 MiB", 3 * 2**40 → "3 TiB"."""
    return _human(n, _BYTE_UNITS, 1024.0)


def byte_unit(n: float) -> tuple[int, str]:
    """The unit `format_bytes(n)` writes `n` in: (its size in bytes, its name), e.g. 3_000_000 → (1048576, "MiB")."""
    exponent = _scale(n, 1024.0, _BYTE_UNITS)[0] if math.isfinite(n) else 0
    return 1024**exponent, _BYTE_UNITS[exponent].strip()


def format_count(n: float) -> str:
    """A count in decimal units: 2000 → "2K", 1_234_567 → "1.2M", 42 → "42"."""
    return _human(n, _COUNT_UNITS, 1000.0)


def format_duration(seconds: float) -> str:
    """A duration rounded to the second: 5 → "5s", 125 → "2m 05s", 3725 → "1h 02m 05s"."""
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, seconds = divmod(rest, 60)
    if hours:
        return f"{hours}h {minutes:02d}m {seconds:02d}s"
    return f"{minutes}m {seconds:02d}s" if minutes else f"{seconds}s"
