"""The documentation in docs/ cannot rot: what it names exists, its layer table matches the
folders, its list of modules is what their docstrings say, the layering it states holds in the
imports, and its Python examples run."""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
ARCHITECTURE = (DOCS / "architecture.md").read_text()


def gen_docs():
    """scripts/gen_docs.py, the generator of docs/' generated parts, as a module."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("gen_docs", ROOT / "scripts" / "gen_docs.py")
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    return gen


def layer_rows() -> set[str]:
    """The folders the layer table describes."""
    section = ARCHITECTURE.split("## The layers", 1)[1].split("\n### ", 1)[0]
    rows = set()
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 2 and cells[0].startswith("`") and cells[0].split("`")[1].endswith("/"):
            rows.add(cells[0].split("`")[1])
    return rows


def listed_modules() -> dict[str, set[str]]:
    """The generated list of modules: folder → the modules listed under it (a package as `name/`)."""
    listed: dict[str, set[str]] = {}
    for part in ARCHITECTURE.split("\n## The modules", 1)[1].split("\n#### ")[1:]:
        folder = part.split("`")[1]
        listed[folder] = set(re.findall(r"^\| `([\w]+/?)` \|", part, flags=re.M))
    return listed


def test_every_file_the_architecture_names_exists():
    named = set(re.findall(r"\b((?:pulse|supervisor|engine|scripts|tests)/[\w/]+\.py)\b", ARCHITECTURE))
    assert named, "the architecture names no file"
    assert sorted(p for p in named if not (ROOT / p).is_file()) == []


def test_the_layer_table_describes_every_package():
    packages = {f"pulse/{p.parent.name}/" for p in (ROOT / "pulse").glob("*/__init__.py")}
    assert packages - layer_rows() == set(), "a package under pulse/ is missing from the layer table"
    assert {row for row in layer_rows() if not (ROOT / row / "__init__.py").is_file()} == set()


def test_the_list_of_modules_is_generated_from_their_docstrings():
    gen = gen_docs()
    start, end = gen.generated(ARCHITECTURE, gen.MODULES_BEGIN)
    assert ARCHITECTURE[start:end] == gen.module_tables(), "run scripts/gen_docs.py"


def test_every_module_says_what_it_is_and_is_in_the_list_of_modules():
    """Every module and package of Pulse has a docstring (what the list of modules says of it), and is
    in that list under its folder."""
    listed = listed_modules()
    undocumented, unlisted = [], []
    for path, _ in source_files():
        rel = path.relative_to(ROOT)
        if rel.parts == ("pulse", "__init__.py") or path.stem == "__main__":
            continue
        if not (ast.get_docstring(ast.parse(path.read_text())) or "").strip():
            undocumented.append(str(rel))
        if path.stem == "__init__":      # a package: a part of the list of its own, and a row of the package above
            nested = len(rel.parts) > 3           # pulse/core/config/__init__.py; a layer's is in the layer table
            known = f"{rel.parent}/" in listed and (not nested or f"{rel.parent.name}/" in listed[f"{rel.parent.parent}/"])
        else:
            known = path.stem in listed.get(f"{rel.parent}/", set())
        if not known:
            unlisted.append(str(rel))
    assert (undocumented, unlisted) == ([], [])


def module_name(path: Path) -> str:
    """The dotted name a source file is imported as (supervisor/ and engine/ install under pulse)."""
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[0] != "pulse":
        parts.insert(0, "pulse")
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@functools.cache
def all_modules() -> frozenset[str]:
    return frozenset(module_name(path) for path, _ in source_files())


def type_checking_only(tree: ast.Module) -> set[int]:
    """The ids of the nodes under an `if TYPE_CHECKING:`: imports for annotations, never run."""
    return {id(inner) for node in ast.walk(tree) if isinstance(node, ast.If)
            and (getattr(node.test, "id", None) or getattr(node.test, "attr", None)) == "TYPE_CHECKING"
            for stmt in node.body for inner in ast.walk(stmt)}


def imported_modules(path: Path, top_level_only: bool, module: str | None = None, run_only: bool = False) -> set[str]:
    """What a file of Pulse imports of Pulse: each `import` and `from … import`, a relative one
    resolved against the file's package, and for `from pulse… import X` also `pulse….X` when X is a
    module (`from pulse import web` imports the web layer). `module`: the file's dotted name.
    run_only: not those under `if TYPE_CHECKING:`, which never run."""
    module = module or module_name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    tree = ast.parse(path.read_text())
    nodes = tree.body if top_level_only else ast.walk(tree)
    skipped = type_checking_only(tree) if run_only else set()
    out = set()
    for node in nodes:
        if id(node) in skipped:
            continue
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[:len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, *([node.module] if node.module else [])])
            out.add(base)
            out.update(f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in all_modules())
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
    return {m for m in out if m == "pulse" or m.startswith("pulse.")}


def test_the_import_checks_see_relative_imports_and_imports_from_pulse(tmp_path):
    source = tmp_path / "mod.py"
    source.write_text("from pulse import web, __version__\nfrom . import tasks\nfrom ..core.config import Agent\n"
                      "def f():\n    from .. import rules\n")
    top = {"pulse", "pulse.web", "pulse.agents", "pulse.agents.tasks", "pulse.core.config"}
    assert imported_modules(source, top_level_only=True, module="pulse.agents.mod") == top
    assert imported_modules(source, top_level_only=False, module="pulse.agents.mod") == top | {"pulse.rules"}
    source.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pulse.store import eventsdb\n"
                      "def f():\n    from pulse.agents import spend\n")
    assert imported_modules(source, top_level_only=False, module="pulse.agents.mod") == \
        {"pulse.store", "pulse.store.eventsdb", "pulse.agents", "pulse.agents.spend"}
    assert imported_modules(source, top_level_only=False, module="pulse.agents.mod", run_only=True) == \
        {"pulse.agents", "pulse.agents.spend"}


def layer_of(module: str) -> str | None:
    """The layer table's folder a dotted module belongs to; None for the `pulse` package itself."""
    parts = module.split(".")
    if len(parts) < 2 or parts[1] == "__version__":
        return None
    installed_as = {"supervisor": "supervisor/", "engine": "engine/"}
    return installed_as.get(parts[1], f"pulse/{parts[1]}/")


def allowed_imports() -> dict[str, set[str]]:
    """The import table of docs/architecture.md: layer → the layers it may import."""
    section = ARCHITECTURE.split("### Who imports whom", 1)[1].split("\n## ", 1)[0]
    table = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 2 and cells[0].startswith("`"):
            table[cells[0].strip("`")] = set(re.findall(r"`([\w/]+/)`", cells[1]))
    return table


def source_files():
    for base in ("pulse", "supervisor", "engine"):
        for path in sorted((ROOT / base).rglob("*.py")):
            if "template" not in path.relative_to(ROOT).parts:     # the agent's, not Pulse's
                yield path, layer_of(".".join(["pulse", *path.relative_to(ROOT).with_suffix("").parts])
                                     if base != "pulse" else ".".join(path.relative_to(ROOT).with_suffix("").parts))


def test_every_import_follows_the_import_table():
    """Every import of Pulse's own code, at the top of a module or inside a function, goes from a
    layer to one the table of docs/architecture.md allows (or within its own layer)."""
    table = allowed_imports()
    nested = {row for row in layer_rows() if row.count("/") > 2}      # a package inside a layer is of that layer
    assert set(table) >= layer_rows() - nested, "a layer is missing from the import table"
    wrong = []
    for path, layer in source_files():
        for module in imported_modules(path, top_level_only=False):
            target = layer_of(module)
            if target not in (None, layer) and target not in table[layer]:
                wrong.append(f"{path.relative_to(ROOT)} ({layer}) imports {module} ({target})")
    assert wrong == []


def test_the_import_table_has_no_cycle():
    table = allowed_imports()
    done: set[str] = set()

    def visit(layer: str, path: tuple[str, ...]) -> None:
        assert layer not in path, f"the import table has a cycle: {' → '.join((*path, layer))}"
        if layer not in done:
            for lower in table.get(layer, ()):
                visit(lower, (*path, layer))
            done.add(layer)

    for layer in table:
        visit(layer, ())


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan's algorithm, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        while work:
            node, edges = work[-1]
            for nxt in edges:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    work.append((nxt, iter(sorted(graph[nxt]))))
                    break
                if nxt in stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    group = []
                    while True:
                        member = stack.pop()
                        group.append(member)
                        if member == node:
                            break
                    if len(group) > 1:
                        found.append(sorted(group))
    return found


def import_graph(top_level_only: bool) -> dict[str, set[str]]:
    """Module → the modules of Pulse it imports when it runs (an `if TYPE_CHECKING:` import never does)."""
    modules = {module_name(path): path for path, _ in source_files()}
    return {name: {m for m in imported_modules(path, top_level_only, module=name, run_only=True) if m in modules and m != name}
            for name, path in modules.items()}


def test_no_import_cycle_at_module_level():
    """Modules import one another at their top without a cycle, within a layer as across them (a
    cycle makes what a module holds depend on which of them was imported first)."""
    assert import_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]   # the check finds one
    assert import_cycles(import_graph(top_level_only=True)) == []


def test_no_import_cycle_through_imports_inside_functions():
    """Nor through an import inside a function: one that runs later hides a cycle rather than breaking
    it (the two modules still need each other, and which is lower is not said); what both need
    belongs in the lower one."""
    assert import_cycles(import_graph(top_level_only=False)) == []


def test_pulsed_imports_only_the_core_at_module_level():
    # pulsed stays small: what else it needs runs in a child (the forkserver, the home-making child)
    for path in (ROOT / "supervisor").glob("*.py"):
        above = {m for m in imported_modules(path, top_level_only=True)
                 if not m.startswith(("pulse.core", "pulse.supervisor"))}
        assert above <= {"pulse"}, f"supervisor/{path.name} imports {above}"


def test_pulsed_never_imports_an_adapter():
    """Checking an [[agent]] (pulsed does, at start and on reload) imports no adapter."""
    import subprocess
    import sys
    code = ("import sys; from pulse.core import config; "
            "text = b'[[agent]]\\nname = \"a\"\\nadapter = \"codex\"\\n'; "
            "config.validate(config.decode(text, 't'), 't'); "
            "print(sorted(m for m in sys.modules if m.startswith('pulse.') and not m.startswith('pulse.core')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def python_examples(doc: Path) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", doc.read_text(), flags=re.S | re.M)


@pytest.mark.parametrize("doc", sorted(DOCS.glob("*.md")), ids=lambda p: p.name)
def test_python_examples_run(doc, tmp_path, monkeypatch):
    """Each ```python block of a page runs, in order, in one namespace (so a later block may use
    what an earlier one defined), in a temporary working directory."""
    monkeypatch.chdir(tmp_path)
    namespace: dict = {"__name__": f"docs.{doc.stem}"}
    for n, block in enumerate(python_examples(doc), 1):
        exec(compile(block, f"{doc.name}[python block {n}]", "exec"), namespace)


def test_the_survival_docstring_names_the_chain_in_its_order():
    from pulse.core import config as configmod
    from pulse.rules import survival
    listed = re.search(r"Outermost first: (.*?)\.\n", survival.__doc__, flags=re.S)[1]
    camel = [name.strip() for name in listed.replace("\n", " ").split(",")]
    snake = [re.sub(r"(?<!^)([A-Z])", r"_\1", name).lower() for name in camel]
    tick = configmod.slice_of(configmod.Config(), "tick")
    assert snake == [rule.__qualname__ for rule in survival.survival_rules(tick)]


def test_the_effect_kinds_reference_is_generated_from_the_registry():
    gen = gen_docs()
    from pulse.effects import registry
    text = (DOCS / "rules.md").read_text()
    start, end = gen.generated(text)
    assert text[start:end] == registry.reference(), "run scripts/gen_docs.py"


def test_effectkind_is_generated_from_the_registry():
    gen = gen_docs()
    assert gen.EFFECT_KINDS.read_text() == gen.effect_kinds_module(), "run scripts/gen_docs.py"


def test_the_rules_guide_names_every_field_of_the_snapshot():
    import msgspec

    from pulse.core.wire.enginerpc import Snapshot
    text = (DOCS / "rules.md").read_text()
    assert [f.name for f in msgspec.structs.fields(Snapshot) if f"`{f.name}`" not in text] == []


def test_the_docs_name_every_survival_rule_and_every_built_in_kind():
    from pulse.core import config as configmod
    from pulse.effects import registry
    from pulse.rules import survival
    readme = (DOCS / "survival.md").read_text() + (DOCS / "configuration.md").read_text()
    tick = configmod.slice_of(configmod.Config(), "tick")
    camel = [re.sub(r"_(\w)", lambda m: m[1].upper(), rule.__qualname__) for rule in survival.survival_rules(tick)]
    assert [name for name in camel if f"**{name}**" not in readme] == []
    # a kind is described where the registry's reference is generated (docs/rules.md), not listed by hand
    reference = (DOCS / "rules.md").read_text()
    assert [kind for kind in registry.all_kinds() if f"### `{kind}`" not in reference] == []


def test_nothing_cites_a_file_outside_the_repository():
    """The repository is what a reader has: no citation of design notes or research kept elsewhere."""
    cited = []
    for path in [*ROOT.glob("*.md"), *DOCS.glob("*.md"), *(p for base in ("pulse", "supervisor", "engine", "scripts")
                                                            for p in (ROOT / base).rglob("*.py"))]:
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if re.search(r"DESIGN(\.md| §)|shared/|research/|seeds/", line):
                cited.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    assert cited == []


def test_no_two_modules_share_a_name():
    """A name says one thing: no module or package of Pulse is named like another (the engine's
    template is the agent's code, not Pulse's)."""
    seen: dict[str, list[str]] = {}
    for base in ("pulse", "supervisor", "engine"):
        for path in (ROOT / base).rglob("*.py"):
            rel = path.relative_to(ROOT)
            if "template" in rel.parts or path.stem == "__main__":
                continue
            name = path.parent.name if path.stem == "__init__" else path.stem
            seen.setdefault(name, []).append(str(rel))
    assert {name: paths for name, paths in seen.items() if len(paths) > 1} == {}
