"""Where the tests find the shared reference material (a `shared/` folder beside the checkout)."""

from __future__ import annotations

import os
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SAMPLES = REPO / "webhook" / "samples"
SHARED = Path(os.environ.get("SHARED_DIR", REPO.parent / "shared"))
FIXTURES = SHARED / "fixtures" / "admission"
