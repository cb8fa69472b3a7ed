"""The job view: HTML pages with inline SVG, drawn from immutable state.

One module draws (`draw`), one composes pages (`pages`); two callers: the sidecar's `/` and
`/jobs/<project>/<experiment>` (rlhf_exporter/server.py) and `diagnose --html`
(rlhf_exporter/commands/diagnose.py).

The package itself imports nothing: `diagnose --format jsonl` writes with `writers` and
`report` and never loads the pages.
"""
