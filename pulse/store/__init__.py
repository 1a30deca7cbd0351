"""Persistence under the home, one module per store; every SQL statement Pulse runs is here.

Modules: `connection` (opening a store: busy timeout, migrations, one-line errors, transactions),
`eventsdb` (events.db's append-only history and the task-* events a task is), `effectqueue` (the
effect queue beside it, claimed by compare-and-set), `errorruns` (errors coalesced without changing
a row), `vitalsdb` (vitals.db's samples), `objects` (content-addressed blobs), `ballast` (the file
freed first when the disk is full), `provision` (making a home and checking it before pulsed starts),
`schedulerun` (a schedule's run: its task or effect and the fact naming it, in one transaction),
`fleetcursor` (the fleet outbox's cursor: the last event the NATS stream acknowledged), `projection`
(folds of events.db checkpointed under the home, so a start folds only what came after), `retention`
(moving the oldest events past [store]'s bounds out of events.db), `archive` (the segments they
move into, and reading them back), `historysize` (the history's size against those bounds, which
status, the page and /metrics show),
`commitwatch` (a wake-up on each commit to events.db, from inotify: readers wait on it, not on a timer).
"""
