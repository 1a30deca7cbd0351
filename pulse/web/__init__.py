"""The operator's window: the web worker's app (`pages`: pages, live streams, actions), who may
use it (`auth`), Prometheus metrics folded from events.db (`metrics`), and the tasks page's board,
a checkpointed projection (`taskboard`). Assets in static/."""
