"""The worker processes pulsed supervises, one module each, around one harness.

Modules: `harness` (what every worker does around its loop: ready, heartbeat, stop),
`watcher` (senses the host), `tick` (runs the rule chain), `executor` (carries out effects),
`enginehost` (the engine: the only process that runs the agent's code), `eventwriter` (the
eventlog: writes pulsed's lifecycle events), `webserver` (the web worker: serves the operator's
page, when enabled), `fleet` (the fleet worker: this host among others over NATS, when enabled),
`fleettasks` (its tasks across hosts), `fleetoutbox` (its events outbox: events.db to the fleet's stream),
`telemetry` (the telemetry worker: a local OTLP receiver, when enabled),
`otlpexport` (its sender of Pulse's runs to an operator's OTLP collector: a bounded queue, a thread),
`otlpmetrics` (its sender of Pulse's own metrics to that collector, through the OpenTelemetry SDK),
`serverthread` (the HTTP server the web and telemetry workers run on a thread of its own).
A module is named for what its process does; the process, for its role.
"""
