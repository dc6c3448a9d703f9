"""OpenAI-compatible HTTP server: app.py (routes), scheduler.py (the one generation thread), jobs.py (what
travels between the handlers and that thread), schemas.py, overrides.py (per-request speculative settings),
metrics.py (Prometheus); `specdec serve` is specdec/cli/serve.py."""
