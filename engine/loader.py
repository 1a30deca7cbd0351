"""Loading an engine directory: rules/, watchers/, executors/.

Each module is imported from its file, in file name order. A module that fails
to import is reported with its file and line and skipped; the rest still load.
"""

from __future__ import annotations

import importlib.util
import sys
import traceback
from dataclasses import dataclass, field
from pathlib import Path

from pulse.engine.api import Executor, Watcher

FOLDERS = ("rules", "watchers", "executors")
EXPORTS = {"rules": "RULES", "watchers": "WATCHERS", "executors": "EXECUTORS"}


@dataclass
class LoadError:
    file: str            # relative to the engine directory
    line: int | None
    error: str

    @property
    def message(self) -> str:
        where = f"{self.file}:{self.line}" if self.line else self.file
        return f"{where}: {self.error}"


@dataclass
class LoadedEngine:
    root: Path
    rules: list = field(default_factory=list)
    watchers: list[Watcher] = field(default_factory=list)
    executors: dict[str, Executor] = field(default_factory=dict)
    errors: list[LoadError] = field(default_factory=list)
    modules: list[str] = field(default_factory=list)


def _where(err: BaseException, path: Path) -> int | None:
    if isinstance(err, SyntaxError) and err.filename and Path(err.filename) == path:
        return err.lineno
    line = None
    for frame in traceback.extract_tb(err.__traceback__):
        if Path(frame.filename) == path:
            line = frame.lineno
    return line


def _import(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    return module


def _exported(module, folder: str, rel: str, engine: LoadedEngine) -> list:
    items = getattr(module, EXPORTS[folder], [])
    if not isinstance(items, (list, tuple)):
        engine.errors.append(LoadError(rel, None, f"{EXPORTS[folder]} must be a list"))
        return []
    kinds = {"rules": callable, "watchers": lambda x: isinstance(x, Watcher),
             "executors": lambda x: isinstance(x, Executor)}
    good = [item for item in items if kinds[folder](item)]
    if len(good) != len(items):
        expected = {"rules": "callables", "watchers": "Watcher instances", "executors": "Executor instances"}
        engine.errors.append(LoadError(rel, None, f"{EXPORTS[folder]} holds items that are not {expected[folder]}"))
    return good


def load(root: Path) -> LoadedEngine:
    # No __pycache__ in the engine's tree: main is a git work tree that promote refuses to touch while
    # it has anything uncommitted, and bytecode written there on the first start (as root, where the
    # tree is writable) made the first promote of a fresh home fail.
    sys.dont_write_bytecode = True
    engine = LoadedEngine(root)
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))   # engine modules may import helpers from their own directory
    for folder in FOLDERS:
        for path in sorted((root / folder).glob("*.py")):
            if path.name.startswith("_"):
                continue
            rel = str(path.relative_to(root))
            try:
                module = _import(path, f"pulse_engine.{folder}.{path.stem}")
            except BaseException as err:   # SystemExit and KeyboardInterrupt from agent code too
                if isinstance(err, MemoryError):
                    raise
                engine.errors.append(LoadError(rel, _where(err, path), f"{type(err).__name__}: {err}"))
                continue
            engine.modules.append(rel)
            items = _exported(module, folder, rel, engine)
            if folder == "rules":
                engine.rules += items
            elif folder == "watchers":
                engine.watchers += items
            else:
                for executor in items:
                    engine.executors[executor.kind] = executor
    return engine
