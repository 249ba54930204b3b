"""`python -m trio_llm.engine`: the engine process (see trio_llm.engine.process)."""

import sys

from trio_llm.engine.process import main

sys.exit(main())
