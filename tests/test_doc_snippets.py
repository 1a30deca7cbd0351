"""What README.md and docs/ show a user to paste or run works as shown.

TOML: every ```toml block is appended to the config.toml a fresh home gets and must load (the
fresh file declares no table a snippet tells one to add). Shell: see test_doc_commands.py.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from pulse.core import config as configmod

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def fenced_blocks(doc: Path, languages: tuple[str, ...]) -> list[tuple[int, str]]:
    """(line number, text) of each fenced block whose info string is one of `languages`."""
    out, lines, i = [], doc.read_text().splitlines(), 0
    while i < len(lines):
        m = re.match(r"^```(\S*)\s*$", lines[i])
        if not m:
            i += 1
            continue
        start, body = i + 1, []
        i += 1
        while i < len(lines) and not lines[i].startswith("```"):
            body.append(lines[i])
            i += 1
        if m[1] in languages:
            out.append((start, "\n".join(body) + "\n"))
        i += 1
    return out


# Another program's TOML shown beside Pulse's (Vector's, in docs/fleet.md) says so on its first line.
NOT_PULSES = re.compile(r"^#.*configuration, not Pulse's")
TOML_BLOCKS = [pytest.param(text, id=f"{doc.name}:{line}") for doc in DOCS for line, text in fenced_blocks(doc, ("toml",))
               if not NOT_PULSES.match(text)]


def test_the_docs_have_toml_snippets():
    assert len(TOML_BLOCKS) >= 5


@pytest.mark.parametrize("snippet", TOML_BLOCKS)
def test_each_toml_snippet_pastes_into_a_fresh_config(snippet):
    configmod.decode(configmod.default_toml() + "\n" + snippet, "fresh config.toml + snippet")


def test_the_fresh_config_declares_no_table():
    """Every table header is commented: uncommenting one is how a setting is changed, and pasting
    a table from the README never declares it twice."""
    declared = [line for line in configmod.default_toml().splitlines() if line.startswith("[")]
    assert declared == []


@pytest.mark.parametrize(("text", "hint"), [
    ("[timings]\nhartbeat_ms = 100\n", "did you mean heartbeat_ms?"),
    ("[survival.llm]\ntarjet = 'x'\n", "did you mean target?"),
    ("level = 'debug'\n", "it belongs in a table: [log]"),
    # a header left commented above the key: which one, on which line
    ("# [log]\nlevel = 'debug'\n",
     "line 2: `level` is a key of [log], and the header above it, `# [log]` (line 1), is commented out"),
    # a key appended after the last table lands in that table: the TOML scoping rule, said
    ("[[agent]]\nname = 'a'\nobserve_only = true\n", "line 3: `observe_only` is a key of the top level: TOML puts a "
     "key in the table whose header is above it (`[[agent]]`, line 1), so move it above the first table header"),
    ("[web]\nenabled = true\npanic_failures = 3\n", "so move it under [survival]"),
    # one bracket where two are meant, and the other way round
    ("[process]\nname = 'x'\n", "write [[process]] (two brackets) above each entry"),
    ("[[web]]\nenabled = true\n", "write [web] (one bracket), once"),
])
def test_an_unknown_key_gets_the_nearest_name(text, hint):
    with pytest.raises(configmod.ConfigError) as err:
        configmod.decode(text, "config.toml")
    assert hint in str(err.value)
