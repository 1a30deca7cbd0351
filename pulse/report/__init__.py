"""The report: what happened on this host, judged, on one page.

Modules: `analysis` (the versioned schema of an analysis, and the check of its citations),
`analyst` (the deterministic analyst: pure functions from events to an analysis), `render`
(the text summary and the self-contained HTML page, pure functions of an analysis and the
events it cites), `reportrun` (the `report` effect: reads the window, runs the analyst, a
configured agent as analyst with the deterministic one as fallback, writes the page, notifies).
"""
