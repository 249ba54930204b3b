"""The dtype of the engines whose tests compare no numbers with a float32 reference.

By default `auto`, the machine's own choice (bfloat16 on AVX512-BF16 and AMX CPUs, float32 on
AVX2-only ones), so each machine class runs the suite the way its users run the server.
`TRIO_LLM_DTYPE=bfloat16 ./scripts/test.sh` forces bfloat16 on every such engine, on any
machine: in-process ones through this constant, servers through the CLI, which reads the same
variable as its --dtype default. Tests that compare with float32 pin float32 themselves.
"""

from __future__ import annotations

import os

ENGINE_DTYPE = os.environ.get("TRIO_LLM_DTYPE", "auto")
