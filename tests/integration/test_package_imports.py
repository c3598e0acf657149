"""What importing a package brings along, seen in a fresh interpreter (the import graph itself:
tests/unit/test_layering.py)."""

from __future__ import annotations

import subprocess
import sys


def test_the_model_carries_no_collective():
    """``msf-enjoy``'s network module must not bring our torch.distributed-using code along."""
    code = (
        "import sys, msf.model; "
        "print(sorted(m for m in sys.modules if m.startswith(('msf.distributed', 'msf.learning'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]", out
