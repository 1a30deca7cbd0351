"""`command`: any CLI. Exit code 0 = done; the result is the exit code and stdout's tail, and a
failure's reason is the exit (or timeout) with stderr's last lines."""

from __future__ import annotations

from pulse.agents.adapters.base import TAIL_CHARS, Adapter, AgentResult, RunOutput, failed_run


class CommandAdapter(Adapter):
    name = "command"

    def parse(self, run: RunOutput) -> AgentResult:
        if run.timed_out or run.code != 0:
            result = failed_run(run)
            result.extra = {"tail": run.text[-TAIL_CHARS:]}
            return result
        return AgentResult(ok=True, extra={"tail": run.text[-TAIL_CHARS:]})
