"""The worker processes pulsed supervises, one module each, around one harness.

Modules: `harness` (what every worker does around its loop: ready, heartbeat, stop),
`watcher` (senses the host), `tick` (runs the rule chain), `executor` (carries out effects),
`engine` (the only process that runs the agent's code), `eventwriter` (writes pulsed's
lifecycle events), `web` (serves the operator's page, when enabled).
"""
