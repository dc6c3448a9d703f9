"""The measuring harness (`specdec bench`): prompts.py (shipped prompt sets), runner.py (the interleaved
loop, medians, pairing), peers.py (transformers and OpenAI-compatible endpoints), memory.py, report.py
(results.json, report.md, PNG plots), cli.py."""
