"""The measuring harness (`specdec bench`, whose flags are specdec/cli/bench.py).

The method bench: method_bench.py (the whole run), prompts.py (shipped prompt sets), methods.py (the
configurations), runner.py (the interleaved loop, medians, pairing), peers.py (transformers and
OpenAI-compatible endpoints), memory.py, provenance.py (runtime and artifacts for the report).
The server load (--concurrency): load.py (levels and their summary), streaming.py (one streamed request,
timed), local_server.py (the `specdec serve` it starts). Both: report.py (results.json, report.md),
plots.py (PNG plots), results_file.py (what --out already holds, and whether a run may join it)."""
