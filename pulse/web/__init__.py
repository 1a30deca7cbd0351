"""The operator's window: the web worker's app (`pages`: pages, live streams, actions), who may
use it (`auth`), and Prometheus metrics folded from events.db (`metrics`). Assets in static/."""
