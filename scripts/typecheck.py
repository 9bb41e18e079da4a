"""mypy over every package trainstack installs, each module under the name it is imported by (`make lint`).

pyproject.toml's package-dir installs train/ and monitoring/ as trainstack.train and trainstack.monitoring through
an import hook that mypy does not follow. Given the folders, mypy would name their modules train.* and
monitoring.*, so every import between the packages would find nothing and read as Any. This hands mypy each module
of the packages setuptools installs (pyproject.toml's packages and package-dir, the lists setuptools reads), with the
file it comes from: a package added to those lists is checked with no change here. The scripts those folders also
hold (monitoring/prometheus/build_rules.py: run from a checkout, not installed) are checked as the top-level
modules their tests load them as.

    .venv/bin/python scripts/typecheck.py [MYPY OPTIONS]

The options are mypy's own; its settings are pyproject.toml's [tool.mypy]. Exits as mypy does: 0 clean, 1 errors,
2 a file it could not check at all.
"""

import os
import sys
import time
import tomllib
from pathlib import Path

from mypy.fscache import FileSystemCache
from mypy.main import process_options, run_build
from mypy.modulefinder import BuildSource
from mypy.util import FancyFormatter, count_stats

REPO = Path(__file__).resolve().parent.parent


def package_folder(package: str, folders: dict[str, str]) -> Path:
    """Where setuptools finds `package`: the longest prefix of its name that package-dir maps gives the folder, the
    rest of the name its subfolders; a name nothing maps is its own path."""
    for prefix in sorted(folders, key=len, reverse=True):
        if package == prefix or package.startswith(prefix + "."):
            return Path(folders[prefix], *package[len(prefix) :].split(".")[1:])
    return Path(*package.split("."))


def installed_modules(repo: Path) -> list[BuildSource]:
    """Each module of each package setuptools installs from `repo`, with its file (relative to `repo`), then each
    script beside them."""
    setuptools = tomllib.loads((repo / "pyproject.toml").read_text())["tool"]["setuptools"]
    folders: dict[str, str] = setuptools["package-dir"]
    modules = []
    for package in setuptools["packages"]:
        folder = package_folder(package, folders)
        for path in sorted((repo / folder).glob("*.py")):
            module = package if path.stem == "__init__" else f"{package}.{path.stem}"
            modules.append(BuildSource(str(folder / path.name), module))
    installed = {Path(str(module.path)) for module in modules}
    for root in sorted(set(folders.values())):
        for path in sorted((repo / root).rglob("*.py")):
            if path.relative_to(repo) not in installed and "__pycache__" not in path.parts:
                modules.append(BuildSource(str(path.relative_to(repo)), path.stem))
    return modules


def main(args: list[str]) -> int:
    started = time.time()
    os.chdir(REPO)  # where [tool.mypy] is read from and the modules' paths start
    modules = installed_modules(REPO)
    fscache = FileSystemCache()
    # mypy's own reading of its settings and options; the files it is told of are these modules', and it is given
    # them below under their installed names rather than the names their folders would give.
    _, options = process_options([*args, *(str(module.path) for module in modules)], fscache=fscache)
    _, messages, blockers = run_build(modules, options, fscache, started, sys.stdout, sys.stderr)
    errors, _, files = count_stats(messages)
    formatter = FancyFormatter(sys.stdout, sys.stderr, options.hide_error_codes)
    if errors:
        print(formatter.format_error(errors, files, len(modules), blockers=blockers, use_color=False))
        return 2 if blockers else 1
    print(formatter.format_success(len(modules), use_color=False))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
