"""No reader folds events.db from its first event by accident: a fold whose cost follows the history
is a checkpointed projection (pulse.store.projection), whose rebuild is the one path allowed to read
from the start. Every other read of the history from the start is named below with why it may, so a
new one fails here until it is a projection or argued for. Static: reads the source's syntax trees."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "pulse"

# Calls that read the whole history whatever their arguments.
WHOLE = {"events_of_types", "event_type_counts", "task_titles", "referenced_objects", "snapshot_extras"}
# Calls that read the whole history unless given a checkpoint directory (the argument at this position,
# or the keyword `checkpoints`).
UNLESS_CHECKPOINTED = {"load_all": 1, "DurableStore": 3}
# Calls that read from the start when their `after_id` (first positional after the connection) is missing
# or 0, and no `since_ts` bounds them; with `since_ts`, in a loop that pages on (a fold of every event
# since a time: its cost follows the history of that window, read again at every start, and it misses
# what retention moved out of the live rows).
FROM_AFTER = {"read_events": 1, "task_events": 1, "gate_facts": 1, "events_after": 1}
# tasks.catch_up(conn, book) folds from the book's position: from the start for a new book.
FROM_BOOK = {"catch_up"}

# module:function → why it may read from the start. Keep it short; shrink it.
ALLOWED = {
    "web/metrics.py:rebuild_counts": "the metrics projection's rebuild (a GROUP BY and the type index)",
    "store/schedulerun.py:rebuild_book": "the schedule book's rebuild: from the first schedule fact (type index)",
    "cli/engineview.py:engine_log": "pulsectl engine log: every promote and rollback (type index)",
    "effects/configfiles.py:known_good_of": "one process's known-good record, on an operator's request (type index)",
    "effects/repairs.py:cleanup": "objects/ garbage collection must see every reference",
}


def offenders() -> set[str]:
    found: set[str] = set()
    for path in sorted(ROOT.rglob("*.py")):
        module = path.relative_to(ROOT).as_posix()
        tree = ast.parse(path.read_text(), str(path))
        _visit(tree, module, [], found)
    return found


def _visit(node: ast.AST, module: str, scope: list[str], found: set[str], paging: bool = False) -> None:
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            _visit(child, module, scope + [child.name], found)
            continue
        if isinstance(child, ast.Call) and _from_start(child, paging):
            where = ".".join(s for s in scope if not s.startswith("_") or s == scope[-1]) or "<module>"
            found.add(f"{module}:{_outer(scope)}" if scope else f"{module}:{where}")
        _visit(child, module, scope, found, paging or isinstance(child, (ast.While, ast.For, ast.AsyncFor)))


def _outer(scope: list[str]) -> str:
    """The name a reader goes by: its class and method, or its function (nested helpers are their parent's)."""
    return ".".join(scope[:2]) if len(scope) > 1 and scope[0][:1].isupper() else scope[0]


def _name(call: ast.Call) -> str | None:
    f = call.func
    return f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else None


def _from_start(call: ast.Call, paging: bool = False) -> bool:
    name = _name(call)
    if name in WHOLE:
        return True
    keywords = {k.arg: k.value for k in call.keywords}
    if name in FROM_AFTER:
        if "since_ts" in keywords:
            return paging
        position = FROM_AFTER[name]
        after = keywords.get("after_id", call.args[position] if len(call.args) > position else None)
        return after is None or (isinstance(after, ast.Constant) and after.value == 0)
    if name in UNLESS_CHECKPOINTED:
        return len(call.args) <= UNLESS_CHECKPOINTED[name] and "checkpoints" not in keywords
    if name in FROM_BOOK:
        book = call.args[1] if len(call.args) > 1 else keywords.get("book")
        return isinstance(book, ast.Call)          # a book made right there: folded from the start
    return False


def test_every_read_of_the_history_from_its_start_is_a_projections_rebuild_or_named():
    found = offenders()
    assert found - ALLOWED.keys() == set(), "new reads of events.db from its first event: make them projections"
    assert ALLOWED.keys() - found == set(), "no longer read from the start: drop them from ALLOWED"


def test_the_check_finds_a_fold_from_the_start(tmp_path):
    # the check itself must see the shapes it is for
    calls = ["eventsdb.read_events(conn, types=['x'])", "eventsdb.read_events(conn, after_id=0)",
             "eventsdb.task_events(conn, 0)", "tasks.catch_up(conn, TaskBook())", "eventsdb.events_of_types(c, t, 9)",
             "tasks.load_all(conn)", "DurableStore(conn, 'web')"]
    for text in calls:
        assert _from_start(ast.parse(text).body[0].value), text
    for text in ["eventsdb.read_events(conn, after_id=last)", "eventsdb.read_events(conn, since_ts=t)",
                 "tasks.catch_up(conn, self.book)", "tasks.load_all(conn, home / 'checkpoints')",
                 "DurableStore(conn, 'web', checkpoints=c)"]:
        assert not _from_start(ast.parse(text).body[0].value), text


def test_the_check_finds_a_fold_of_every_event_since_a_time():
    # a loop paging on by time re-reads the window at every start and misses what retention moved
    paged = "def load(conn):\n    while True:\n        events = eventsdb.read_events(conn, after_id=after, since_ts=t)\n"
    found: set[str] = set()
    _visit(ast.parse(paged), "agents/spend.py", [], found)
    assert found == {"agents/spend.py:load"}
    once = "def events(conn):\n    return eventsdb.read_events(conn, after_id=first, since_ts=t, limit=100)\n"
    found = set()
    _visit(ast.parse(once), "agents/toolserver.py", [], found)
    assert found == set()
