"""Every bench entry point starts as bench/README.md says: `python bench/<folder>/<script>.py
--help` in a fresh interpreter from the repository's root, with the path a user has (the
script's folder first, bench/ and tests/ not added by anyone but the script itself), so a
module that shadows an installed package, a missing package or a broken import fails here. The
commands in bench/README.md, README.md and every report under bench/results/ name scripts that
exist, with flags those scripts take; no name a bench script puts first on the path is one that
something else imports (bench/kernels.py once shadowed the `kernels` package transformers
imports)."""

from __future__ import annotations

import ast
import importlib.machinery
import importlib.util
import os
import re
import shlex
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench"
ENTRY_POINTS = sorted(
    path.relative_to(ROOT)
    for path in BENCH.rglob("*.py")
    if 'if __name__ == "__main__":' in path.read_text()
)
COMMAND = re.compile(r"`((?:[A-Z_]+=\S+ )*(?:python3?|bash) [^`]*?bench/[^`]*)`", re.S)
"""A backticked command that runs a bench script: `python bench/...`, `bash bench/...`."""


def user_env() -> dict[str, str]:
    """This environment without bench/ or tests/ on PYTHONPATH: only the script may add them."""
    keep = [
        entry
        for entry in os.environ.get("PYTHONPATH", "").split(os.pathsep)
        if entry
        and not Path(entry).resolve().is_relative_to(BENCH)
        and Path(entry).resolve() != ROOT / "tests"
    ]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(keep)}


def run_help(script: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(script), "--help"],
        cwd=ROOT,
        env=user_env(),
        capture_output=True,
        text=True,
        timeout=240,
    )


@pytest.fixture(scope="module")
def helps() -> dict[Path, subprocess.CompletedProcess[str]]:
    """Each entry point's --help, all at once: each imports torch or transformers (2-4 s)."""
    with ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 2)) as pool:
        return dict(zip(ENTRY_POINTS, pool.map(run_help, ENTRY_POINTS), strict=True))


def options(help_text: str) -> set[str]:
    """The flags a script's parser takes: those of its options section, not of its description
    (a docstring may name a flag the parser no longer has)."""
    return set(re.findall(r"(?<![\w-])--[\w-]+", help_text.rpartition("\noptions:\n")[2]))


@pytest.mark.parametrize("script", ENTRY_POINTS, ids=str)
def test_entry_point_help_runs(helps: dict[Path, subprocess.CompletedProcess[str]], script: Path):
    result = helps[script]
    assert result.returncode == 0 and result.stdout.startswith("usage:"), result.stderr[-3000:]


def documents() -> list[Path]:
    return [BENCH / "README.md", ROOT / "README.md", *sorted((BENCH / "results").glob("*.md"))]


@pytest.mark.parametrize("document", documents(), ids=lambda p: str(p.relative_to(ROOT)))
def test_documented_commands_name_real_scripts_and_flags(
    helps: dict[Path, subprocess.CompletedProcess[str]], document: Path
):
    commands = [" ".join(c.split()) for c in COMMAND.findall(document.read_text())]
    problems = []
    for command in commands:
        if "<" in command:  # a template, `python bench/<folder>/<script>.py`
            continue
        words = shlex.split(command)
        script = Path(next(w for w in words if w.startswith("bench/")))
        if not (ROOT / script).is_file():
            problems.append(f"{command}: no {script}")
            continue
        if script.suffix != ".py":
            continue
        if script not in helps:
            problems.append(f"{command}: {script} is not an entry point")
            continue
        known = options(helps[script].stdout)
        flags = {w.partition("=")[0] for w in words if w.startswith("--") and " " not in w}
        problems += [f"{command}: {script} takes no {flag}" for flag in sorted(flags - known)]
    assert not problems, "\n".join(problems)


def test_every_report_names_its_command():
    missing = [
        str(report.relative_to(ROOT))
        for report in sorted((BENCH / "results").glob("*.md"))
        if not re.search(r"^Command: .*`(?:python|bash) bench/", report.read_text(), re.M)
    ]
    assert not missing, f"no 'Command:' line naming a bench script: {missing}"


def test_bench_readme_lists_every_entry_point():
    readme = (BENCH / "README.md").read_text()
    scripts = [*ENTRY_POINTS, *(p.relative_to(ROOT) for p in BENCH.rglob("*.sh"))]
    unlisted = [str(s) for s in scripts if f"`{s.relative_to('bench')}`" not in readme]
    assert not unlisted, f"bench/README.md does not list: {unlisted}"


def front_of_path_names() -> dict[str, list[Path]]:
    """The module names a bench script finds first: the entries of bench/ (every entry point
    puts it first) and of each folder holding an entry point (its script's sys.path[0])."""
    folders = {BENCH, *(ROOT / script.parent for script in ENTRY_POINTS)}
    names: dict[str, list[Path]] = {}
    for folder in sorted(folders):
        for entry in folder.iterdir():
            if entry.name.startswith(("_", ".")):
                continue
            if entry.suffix == ".py" or (entry.is_dir() and entry.name != "results"):
                names.setdefault(entry.stem, []).append(entry.relative_to(ROOT))
    return names


def names_in_tests() -> set[str]:
    """What the tests import by bare name (pytest puts their folders on the path): their
    modules and packages."""
    tests = ROOT / "tests"
    packages = {p.parent.name for p in tests.rglob("__init__.py")}
    return {p.stem for p in tests.rglob("*.py")} | packages


def test_no_bench_name_shadows_another_module():
    elsewhere = [
        entry
        for entry in sys.path
        if entry and not Path(entry).resolve().is_relative_to(BENCH) and Path(entry).is_dir()
    ]
    taken = names_in_tests()
    problems = []
    for name, places in front_of_path_names().items():
        if len(places) > 1:
            problems.append(f"{name}: more than one bench module of that name: {places}")
        spec = importlib.machinery.PathFinder.find_spec(name, elsewhere)
        if name in sys.stdlib_module_names or name in sys.builtin_module_names:
            problems.append(f"{places[0]}: `{name}` is a standard library module")
        elif name in taken:
            problems.append(f"{places[0]}: `{name}` is a module of tests/")
        elif spec is not None and spec.origin is not None:  # not a folder of test files
            problems.append(f"{places[0]}: `{name}` is importable from {spec.origin}")
    assert not problems, "\n".join(problems)


OPTIONAL = {
    "matplotlib": "the bench extra: without it compare.py and serve.py write no plot",
    "xgrammar": "only `structured.py libraries` compares it with llguidance",
}
"""Packages a bench script imports that the project does not install, and why that is fine."""


def test_every_package_a_bench_script_imports_is_installed():
    """Where an import sits in a function, --help never reaches it: read them all from the
    source. A bench module is imported by its path under bench/ (`from serving import serve`),
    never by a bare name that only its own folder's script would find."""
    local = {entry.stem for entry in BENCH.iterdir()} | names_in_tests()
    problems = []
    for path in sorted(BENCH.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for top in {name.partition(".")[0] for name in names} - local - OPTIONAL.keys():
                if importlib.util.find_spec(top) is None:
                    problems.append(f"{path.relative_to(ROOT)}:{node.lineno}: no module {top}")
    assert not problems, "\n".join(problems)
