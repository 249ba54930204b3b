"""How does trio-llm serve over HTTP: against its peers (compare.py, one entry point), under
any load (serve.py), under minutes of mixed and hostile traffic (soak.py), and what its
frontend-engine transport costs (ipc.py)? bench/README.md lists the commands."""
