"""The chat page: GET / and /ui/<name> (endpoint.py), and its static files beside it."""
