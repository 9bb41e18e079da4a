"""docs/architecture.md names every module of trainstack/ (its module map): a module added without its line fails
here, so the one-page map stays whole."""

from tests.helpers.runs import REPO as ROOT

MAP = (ROOT / "docs/architecture.md").read_text().split("Every module of `trainstack/`", 1)[1].split("\n\n", 2)[1]


def test_every_trainstack_module_has_its_line_in_the_module_map():
    modules = {path.name for path in (ROOT / "trainstack").glob("*.py") if path.name != "__init__.py"}
    modules |= {f"{path.parent.name}/" for path in (ROOT / "trainstack").glob("*/__init__.py")}
    modules |= {path.name for path in (ROOT / "trainstack/telemetry").glob("*.py") if path.name != "__init__.py"}
    missing = sorted(name for name in modules if f"`{name}`" not in MAP)
    assert not missing, f"docs/architecture.md's module map of trainstack/ lacks {missing}"
