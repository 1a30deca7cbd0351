"""Percept: sensors that sample the host into vitals.

Modules: `builtin` (the built-in watchers: system-resource, process-alive, health, network,
error-log, file), `freshness` (proof that work happens: [[watch.fresh]]), `runner` (runs watchers
in a worker without blocking its loop), `otlp` (the agent CLIs' OpenTelemetry, folded into what each
run or session did).
"""
