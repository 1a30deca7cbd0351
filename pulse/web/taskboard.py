"""The tasks page's fold: the open tasks, the newest SHOWN_ENDED that ended and how many ended in each
status, and each agent's counts, as a checkpointed projection (pulse.store.projection) the web worker
keeps. Its memory follows the open tasks, not the history; its checkpoint makes a restarted web
worker's first look at the page fold only the task events since the last one, not every task event
since the host began."""

from __future__ import annotations

from typing import NamedTuple

import msgspec

from pulse.agents import tasks
from pulse.core.wire import enginerpc, eventmsgs
from pulse.store import projection

NAME = "web.tasks"
SHOWN_ENDED = 100                 # ended tasks (closed, given up) the tasks page lists, newest first; all are counted


class TaskBoard(tasks.AgentStatsFold):
    """The open tasks, the newest SHOWN_ENDED that ended and how many ended in each status, and each
    agent's counts (exact: an ended task's run is counted before it is dropped)."""

    def __init__(self) -> None:
        super().__init__(forget_ended=True)
        self.ended: dict[str, enginerpc.TaskState] = {}           # task id → its final state, oldest first
        self.ended_counts: dict[str, int] = {}

    def forget_if_ended(self, task: str) -> None:
        state = self.tasks.get(task)
        if state is None:
            return
        if state.status not in tasks.ENDED:
            if task in self.ended:       # retried by the operator: open again
                self.ended_counts[self.ended.pop(task).status] -= 1
            return
        del self.tasks[task]
        self.ended_counts[state.status] = self.ended_counts.get(state.status, 0) + 1
        self.ended.pop(task, None)
        self.ended[task] = state
        if len(self.ended) > SHOWN_ENDED:
            del self.ended[next(iter(self.ended))]

    def shown(self) -> list:
        return [*self.tasks.values(), *self.ended.values()]

    def counts(self) -> dict[str, int]:
        out = dict(self.ended_counts)
        for state in self.tasks.values():
            out[state.status] = out.get(state.status, 0) + 1
        return out


class TaskBoardView(NamedTuple):
    shown: list                       # the open tasks and the newest ended ones (TaskState)
    counts: dict[str, int]            # tasks by status, every one that ever ended included
    stats: dict                       # agent → AgentCapabilityStats


def new_task_board() -> tasks.TaskBook:
    """A TaskBook whose fold is a TaskBoard."""
    book = tasks.TaskBook()
    book.agents = TaskBoard()
    return book


def _dump(book: tasks.TaskBook) -> dict:
    board = book.agents
    return {"stats": board.stats, "tasks": board.tasks, "ended": board.ended, "ended_counts": board.ended_counts,
            "last_id": book.last_id}


def _load(raw: dict) -> tasks.TaskBook:
    book = new_task_board()
    board = book.agents
    board.stats.update(msgspec.convert(raw["stats"], dict[str, enginerpc.AgentCapabilityStats]))
    board.tasks.update(msgspec.convert(raw["tasks"], dict[str, enginerpc.TaskState]))
    board.ended.update(msgspec.convert(raw["ended"], dict[str, enginerpc.TaskState]))     # in the order they ended
    board.ended_counts.update(msgspec.convert(raw["ended_counts"], dict[str, int]))
    book.last_id = raw["last_id"]
    return book


PROJECTION = projection.Projection(
    name=NAME, new=new_task_board, fold=tasks.TaskBook.fold, types=tuple(eventmsgs.TASK_EVENTS), dump=_dump, load=_load,
    code=(TaskBoard, tasks.TaskBook, tasks.AgentStatsFold, enginerpc.TaskState, enginerpc.AgentCapabilityStats, tasks.fold_one,
          tasks.apply, tasks.credited_agent, tasks.add_usage, tasks.TRANSITIONS, tasks.ENDED, SHOWN_ENDED))


def view(book: tasks.TaskBook) -> TaskBoardView:
    """What the page shows, copied to read outside the fold's lock (its states are replaced, never
    changed; its stats are copied)."""
    board = book.agents
    return TaskBoardView(board.shown(), board.counts(),
                         {name: msgspec.structs.replace(s) for name, s in board.stats.items()})
