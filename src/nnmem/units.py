"""Bytes ⇄ text. Bytes are ``int`` everywhere else; output uses IEC units (KiB, MiB, GiB)."""

from __future__ import annotations

import re

from nnmem.errors import ConfigError

__all__ = ["format_bytes", "parse_size"]

_IEC = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"]

# Accepted suffixes, lower-cased. "GB" is taken as decimal (10**9), "GiB" as binary (2**30), as the SI
# and IEC standards say; a bare "G" follows the common `nvidia-smi`/`free -h` habit of meaning GiB.
_SUFFIX = {
    "": 1,
    "b": 1,
    "k": 2**10,
    "kib": 2**10,
    "kb": 10**3,
    "m": 2**20,
    "mib": 2**20,
    "mb": 10**6,
    "g": 2**30,
    "gib": 2**30,
    "gb": 10**9,
    "t": 2**40,
    "tib": 2**40,
    "tb": 10**12,
}

_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")


def parse_size(text: str | int) -> int:
    """Parse a memory size such as ``"16GiB"``, ``"16 GB"``, ``"512MiB"`` or ``1024`` into bytes.

    Args:
        text: the size; an ``int`` is taken as bytes.

    Returns:
        The size in bytes.

    Raises:
        ConfigError: the text is not a positive size with a known unit.

    Example:
        >>> parse_size("16GiB")
        17179869184
    """
    if isinstance(text, bool):
        raise ConfigError(f"expected a memory size such as '16GiB' or '16 GB'. Received: {text!r}")
    if isinstance(text, int):
        if text <= 0:
            raise ConfigError(f"expected a positive memory size in bytes. Received: {text}")
        return text
    match = _SIZE_RE.match(str(text))
    unit = match.group(2).lower() if match else None
    if match is None or unit not in _SUFFIX:
        raise ConfigError(
            f"expected a memory size such as '16GiB', '16 GB' or '512MiB'. Received: {text!r}"
        )
    value = float(match.group(1)) * _SUFFIX[unit]
    if value < 1:
        raise ConfigError(f"expected a positive memory size. Received: {text!r}")
    return int(value)


def format_bytes(n: int, precision: int = 2) -> str:
    """Format a byte count with IEC units: ``format_bytes(167208) == '163.29 KiB'``.

    Args:
        n: a count in bytes (may be negative, for differences).
        precision: digits after the decimal point for units above bytes.
    """
    sign = "-" if n < 0 else ""
    value = float(abs(n))
    for unit in _IEC:
        if value < 1024 or unit == _IEC[-1]:
            if unit == "B":
                return f"{sign}{int(value)} B"
            return f"{sign}{value:.{precision}f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")
