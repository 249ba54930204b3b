"""The layers import only downward: scripts/import_cycles.py finds no cycle in trio_llm's import
graph (every import statement, module-level, function-level or type-only, read from source)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "import_cycles.py"


def test_no_import_cycle() -> None:
    found = subprocess.run(
        [sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=60
    )
    assert found.returncode == 0, found.stdout + found.stderr
