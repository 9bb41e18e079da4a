"""docs/architecture.md names every module of trainstack/ (its module map), and every module of the supervisor and
the commands (its import layout): a module added without its line fails here, so the one-page map stays whole."""

from pathlib import Path

from tests.helpers.runs import REPO as ROOT

DOC = (ROOT / "docs/architecture.md").read_text()
MAP = DOC.split("Every module of `trainstack/`", 1)[1].split("\n\n", 2)[1]
LAYOUT = DOC.split("## Import layout", 1)[1].split("\n## ", 1)[0]


def modules_of(folder: Path) -> set[str]:
    """Its modules by file name, and its subpackages as `name/`."""
    modules = {path.name for path in folder.glob("*.py") if path.name != "__init__.py"}
    return modules | {f"{path.parent.name}/" for path in folder.glob("*/__init__.py")}


def test_every_trainstack_module_has_its_line_in_the_module_map():
    modules = modules_of(ROOT / "trainstack") | modules_of(ROOT / "trainstack/telemetry")
    missing = sorted(name for name in modules if f"`{name}`" not in MAP)
    assert not missing, f"docs/architecture.md's module map of trainstack/ lacks {missing}"


def test_every_module_of_the_supervisor_and_the_commands_is_in_the_import_layout():
    for folder in ("supervisor", "commands"):
        row = next(line for line in LAYOUT.splitlines() if line.startswith(f"| `{folder}/` |"))
        missing = sorted(name for name in modules_of(ROOT / folder) if f"`{name}`" not in row)
        assert not missing, f"docs/architecture.md's import layout row for {folder}/ lacks {missing}"
