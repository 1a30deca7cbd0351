"""The operator's window: the web worker's app (`pages`: the HTML pages, the guard and the app), its
JSON API (`reads`), its live streams (`streams`) and its actions (`actions`), what their routes share
(`site`), who may use it (`auth`), Prometheus metrics folded from events.db (`metrics`), and the tasks
page's board, a checkpointed projection (`taskboard`). Assets in static/."""
