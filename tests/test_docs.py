"""The documentation in docs/ cannot rot: what it names exists, its layer table matches the
folders, the layering it states holds in the imports, and its Python examples run."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
ARCHITECTURE = (DOCS / "architecture.md").read_text()


def modules_in(folder: Path) -> set[str]:
    return {p.stem for p in folder.glob("*.py") if p.stem not in ("__init__", "__main__")}


def layer_rows() -> dict[str, set[str]]:
    """The layer table: folder → the modules its row lists."""
    rows = {}
    for line in ARCHITECTURE.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[0].startswith("`") and cells[0].split("`")[1].endswith("/"):
            folder = cells[0].split("`")[1]
            rows[folder] = {m for m in re.findall(r"`([\w]+)`", cells[2])}
    return rows


def test_every_file_the_architecture_names_exists():
    named = set(re.findall(r"\b((?:pulse|supervisor|engine|scripts|tests)/[\w/]+\.py)\b", ARCHITECTURE))
    assert named, "the architecture names no file"
    assert sorted(p for p in named if not (ROOT / p).is_file()) == []


def test_the_layer_table_lists_every_package_and_exactly_its_modules():
    rows = layer_rows()
    packages = {f"pulse/{p.parent.name}/" for p in (ROOT / "pulse").glob("*/__init__.py")}
    assert packages - set(rows) == set(), "a package under pulse/ is missing from the layer table"
    for folder, listed in rows.items():
        if folder == "pulse/cli/":
            continue   # one module per command group: listed by `pulsectl --help`, not here
        assert listed == modules_in(ROOT / folder), folder


def test_each_package_docstring_names_exactly_its_modules():
    for init in [*(ROOT / "pulse").glob("*/__init__.py"), ROOT / "supervisor" / "__init__.py",
                 ROOT / "engine" / "__init__.py"]:
        if init.parent.name == "cli":
            continue
        doc = ast.get_docstring(ast.parse(init.read_text())) or ""
        named = set(re.findall(r"`(\w+)`", doc))
        assert modules_in(init.parent) <= named, f"{init.relative_to(ROOT)} does not name every module"


def imported_modules(path: Path, top_level_only: bool) -> set[str]:
    tree = ast.parse(path.read_text())
    nodes = tree.body if top_level_only else ast.walk(tree)
    out = set()
    for node in nodes:
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
    return {m for m in out if m == "pulse" or m.startswith("pulse.")}


# What core may reach above itself, inside a function only: config's checks of names that a higher
# layer defines (an [[agent]]'s adapter and placeholders), done once when config is loaded; and
# ensure_home making the stores, which runs in pulsectl init or pulsed's home-making child only.
CORE_LAZY_IMPORTS = {"config.py": {"pulse.agents"}, "home.py": {"pulse.store"}}


def test_core_imports_nothing_of_pulse_above_it():
    for path in (ROOT / "pulse" / "core").glob("*.py"):
        at_top = {m for m in imported_modules(path, top_level_only=True) if not m.startswith("pulse.core")}
        assert at_top <= {"pulse"}, f"{path.name} imports {at_top}"
        anywhere = {m for m in imported_modules(path, top_level_only=False) if not m.startswith("pulse.core")}
        assert anywhere - {"pulse"} <= CORE_LAZY_IMPORTS.get(path.name, set()), f"{path.name} imports {anywhere}"


def test_pulsed_imports_only_the_core_at_module_level():
    # pulsed stays small: what else it needs runs in a child (the forkserver, the home-making child)
    for path in (ROOT / "supervisor").glob("*.py"):
        above = {m for m in imported_modules(path, top_level_only=True)
                 if not m.startswith(("pulse.core", "pulse.supervisor"))}
        assert above <= {"pulse"}, f"supervisor/{path.name} imports {above}"


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
    import importlib.util
    spec = importlib.util.spec_from_file_location("gen_docs", ROOT / "scripts" / "gen_docs.py")
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    from pulse.effects import registry
    text = (DOCS / "rules.md").read_text()
    start, end = gen.generated(text)
    assert text[start:end] == registry.reference(), "run scripts/gen_docs.py"


def test_the_rules_guide_names_every_field_of_the_snapshot():
    import msgspec

    from pulse.core.wire import Snapshot
    text = (DOCS / "rules.md").read_text()
    assert [f.name for f in msgspec.structs.fields(Snapshot) if f"`{f.name}`" not in text] == []
