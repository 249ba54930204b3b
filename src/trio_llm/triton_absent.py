"""Keep Triton out of a process that will never run it.

Loading a transformers model or processor imports torch._dynamo, which imports Triton when it is
installed (it is, on every Linux x86-64 machine: the kernels' tests run it interpreted). Triton's
nanobind modules then print hundreds of "leaked function" lines when the process exits, the last
thing a user sees after Ctrl-C. Marking the module absent makes its import fail, which torch reads
as "no Triton". Used by the server's frontend (it runs no kernels: engines do, in their own
processes) and by a CPU engine (engine/process.py says when).
"""

from __future__ import annotations

import sys


def mark_triton_absent() -> None:
    """Make `import triton` fail from now on in this process; a no-op where it is imported."""
    sys.modules.setdefault("triton", None)  # type: ignore[arg-type]
