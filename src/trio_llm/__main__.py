"""`python -m trio_llm` is `trio-llm`."""

from trio_llm.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
