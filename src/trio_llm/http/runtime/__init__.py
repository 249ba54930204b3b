"""What one running app holds, Quart-aware and free of OpenAI shapes: state.py (AppState:
router, model cards, admission, metrics), lifespan.py (engines started and stopped with the
app), supervisor.py (one replica's restart loop), middleware.py (per-request cleanup, CORS,
API key, request count), admission.py (capacity), metrics.py (Prometheus), bodies.py (JSON
in and out)."""
