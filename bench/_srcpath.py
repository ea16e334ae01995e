"""Imported first by every bench script: puts this checkout's src/ at the front of sys.path,
so `python bench/X.py` runs from a plain checkout with no install and never measures another
installed copy of fp8rl."""

import sys
from pathlib import Path

SRC = str(Path(__file__).resolve().parents[1] / "src")
if sys.path[:1] != [SRC]:
    while SRC in sys.path:
        sys.path.remove(SRC)
    sys.path.insert(0, SRC)
