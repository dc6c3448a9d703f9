"""OpenAI-compatible HTTP server: app.py (routes, SSE), worker.py (the one generation thread),
schemas.py, overrides.py (per-request speculative settings), metrics.py (Prometheus), cli.py (`specdec serve`)."""
