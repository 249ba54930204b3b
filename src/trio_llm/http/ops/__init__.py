"""What operators ask of the server: /health, /ping, /version, /metrics (endpoint.py) and
/openapi.json (openapi.py)."""
