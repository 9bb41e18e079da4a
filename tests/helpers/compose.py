"""Compose's sizes, read as Docker reads them."""

from __future__ import annotations

import re

GiB = 1024**3


def size_bytes(text: str) -> int:
    number, unit = re.fullmatch(r"(\d+)\s*([kmg]?)b?", str(text).lower()).groups()
    return int(number) * {"": 1, "k": 1024, "m": 1024**2, "g": GiB}[unit]
