"""An [[agent]]'s argv template: placeholders substituted element by element, never a shell string.

    {prompt} {task_id} {title} {project} {agent} {workdir}      ({{ and }} are literal braces)

env values take the same placeholders; cwd takes {task_id} {agent} {project}. Here, below the
adapters, so config validates a template without importing them (pulsed never does).
"""

from __future__ import annotations

from typing import Iterable

PLACEHOLDERS = ("prompt", "task_id", "title", "project", "agent", "workdir")
CWD_PLACEHOLDERS = ("task_id", "agent", "project")


def placeholders(template: str, allowed: Iterable[str] = PLACEHOLDERS) -> list[str]:
    """The placeholders of `template`; ValueError naming an unknown or malformed one."""
    import string  # here, not at the top: pulsed imports this module and never needs it without agents
    allowed = tuple(allowed)
    out = []
    try:
        parsed = list(string.Formatter().parse(template))
    except ValueError as err:
        raise ValueError(f"malformed template {template!r}: {err} (write {{{{ and }}}} for literal braces)") from None
    for _, name, spec, conversion in parsed:
        if name is None:
            continue
        if name not in allowed or spec or conversion:
            shown = "{" + name + (f"!{conversion}" if conversion else "") + (f":{spec}" if spec else "") + "}"
            raise ValueError(f"unknown placeholder {shown}; known: {', '.join('{' + a + '}' for a in allowed)}")
        out.append(name)
    return out


def substitute(template: str, values: dict[str, str]) -> str:
    """`template` with its placeholders replaced by plain text: no format mini-language, no shell."""
    import string  # as in the function above
    parts = []
    for literal, name, _, _ in string.Formatter().parse(template):
        parts.append(literal)
        if name is not None:
            parts.append(values[name])
    return "".join(parts)
