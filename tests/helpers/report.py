"""Reading a report's page back: the figures embedded in it."""

from __future__ import annotations

import base64
import io
import re
from pathlib import Path

from PIL import Image


def embedded_figures(report: Path) -> dict[str, Image.Image]:
    text = report.read_text()
    found = re.findall(r"<figure id='([\w-]+)'><img alt='[\w-]+' src='data:image/png;base64,([^']+)'>", text)
    return {figure_id: Image.open(io.BytesIO(base64.b64decode(data))) for figure_id, data in found}
