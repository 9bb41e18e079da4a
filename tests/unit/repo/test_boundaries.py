"""The package boundaries (docs/architecture.md, "Package boundaries"), checked on the source.

- The exporter and diagnose never import torch: they run beside the ranks, on hosts and in containers that may
  not have it, and torch's import alone costs seconds and hundreds of MB.
- train/ and monitoring/ never import each other; what they share lives in trainstack/ (errors, the run
  directory, the metric catalog, the CLI that composes them).
- No trainstack command that must run beside a user's stack loads torch: `trainstack --help`, `diagnose`,
  `exporter` and `report` (tests/process/test_cli_imports.py runs the commands themselves).
- No import cycles among the project's modules.

Each check is a function of a source tree, so the tests at the end plant a violation in a scratch tree and see
the check catch it: a check that cannot fail proves nothing.
"""

from __future__ import annotations

import ast
from pathlib import Path

from tests.helpers.runs import REPO
from tests.helpers.source_tree import plant, project_modules, within_any

# The rooms above the ground (trainstack/) -> the other rooms each may import. train/ and monitoring/ import neither
# each other nor a room above; the supervisor serves `trainstack train` and `trainstack watch` alike, so it never
# imports train/, and it reads monitoring/'s judge and report directly; the commands compose them all.
ROOMS = {
    "trainstack.train": (),
    "trainstack.monitoring": (),
    "trainstack.supervisor": ("trainstack.monitoring",),
    "trainstack.commands": ("trainstack.train", "trainstack.monitoring", "trainstack.supervisor"),
}
# The one trainstack module that may import the rooms: `python -m trainstack`, the entry point that runs the CLI
# (trainstack.commands.cli). Every other trainstack module is shared ground: the loop API (trainstack.monitor) stands
# on the rank's telemetry beneath it (trainstack.telemetry), and the app's Trainer is one more client of that API.
ENTRY_POINTS = ("trainstack.__main__",)
# What the loop API and its telemetry stand on: trainstack's shared ground, never the app or the monitoring side.
LOOP_API = ("trainstack.monitor", "trainstack.telemetry")


# Packages whose members are each a part of the design: a module, or a subpackage taken whole.
GROUPS = {
    "trainstack",
    "trainstack.train",
    "trainstack.train.launcher",
    "trainstack.train.rank",
    "trainstack.monitoring",
    "trainstack.supervisor",
    "trainstack.commands",
}


def within(modules: dict[str, Path], packages) -> dict[str, Path]:
    return {
        name: path
        for name, path in modules.items()
        if any(name == package or name.startswith(package + ".") for package in packages)
    }


def import_statements(name: str, path: Path) -> list[tuple[str, list[str]]]:
    """(module, names) for every import statement in the file, at any depth: `import a.b` is ("a.b", []),
    `from a import b, c` is ("a", ["b", "c"]), relative ones resolved. An import inside a function is still a
    dependency (it runs the first time that function does, and a cycle through it can fail then), so it counts."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    statements = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            statements += [(alias.name, []) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join([*parts[: len(parts) - node.level + 1], *([node.module] if node.module else [])])
            statements.append((base, [alias.name for alias in node.names]))
    return statements


def imported_names(name: str, path: Path) -> set[str]:
    """Every module name the file's imports mention (`from p import x`: p and p.x, x may be a submodule)."""
    return {full for base, names in import_statements(name, path) for full in (base, *(f"{base}.{n}" for n in names))}


def import_graph(root: Path) -> dict[str, set[str]]:
    """module -> the project modules it imports. `from p import x` depends on p.x when that is a module (p is
    then only its parent package, initialised first, as for any submodule), else on p. A module imported by a
    name in a string (importlib.import_module) is not seen: commands/cli.py, the one place that does it, is
    imported by nothing but trainstack/__main__.py."""
    modules = project_modules(root)
    graph = {}
    for name, path in modules.items():
        targets = set()
        for base, names in import_statements(name, path):
            if not names:
                while base and base not in modules:  # `import a.b.c` of a non-module c: its module
                    base = base.rpartition(".")[0]
                targets.add(base)
            for imported in names:
                targets.add(f"{base}.{imported}" if f"{base}.{imported}" in modules else base)
        graph[name] = {target for target in targets if target in modules and target != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def subpackage_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """The same imports between components: a subpackage of a GROUPS package (the doctor, the exporter, ...) is
    one node with all its modules; a GROUPS package's own modules (the launcher's launch, the rank's trainer) stay
    nodes of their own. A loop here is a loop between parts of the design even where each module imports fine
    (the doctor's cli importing the launcher, which imports the doctor)."""

    def component(module: str) -> str:
        parts = module.split(".")
        for end in range(1, len(parts) + 1):
            if ".".join(parts[: end - 1]) in GROUPS and ".".join(parts[:end]) not in GROUPS:
                return ".".join(parts[:end])
        return module

    merged: dict[str, set[str]] = {}
    for module, targets in graph.items():
        merged.setdefault(component(module), set()).update(component(t) for t in targets)
    return {node: targets - {node} for node, targets in merged.items()}


def crossings(root: Path) -> list[str]:
    """`module -> imported name` for every import from one of the ROOMS into another it may not import."""

    def side(module: str) -> str | None:
        return next((part for part in ROOMS if module == part or module.startswith(part + ".")), None)

    found = []
    for name, path in within(project_modules(root), ROOMS).items():
        mine = side(name)
        for target in sorted(imported_names(name, path)):
            theirs = side(target)
            if theirs and theirs != mine and theirs not in ROOMS[mine]:
                found.append(f"{name} -> {target}")
    return found


def test_each_room_imports_only_the_rooms_beneath_it():
    assert crossings(REPO) == []


def app_imports(root: Path, packages: tuple[str, ...] | None = None) -> list[str]:
    """`module -> imported name` for every import of a room (train/, monitoring/, the supervisor, the commands) by
    a trainstack module (those of `packages` only, when given) that is not one of the ENTRY_POINTS."""
    return [
        f"{name} -> {target}"
        for name, path in project_modules(root, {"trainstack": "trainstack"}).items()
        if not within_any(name, ENTRY_POINTS) and (packages is None or within_any(name, packages))
        for target in sorted(imported_names(name, path))
        if target.startswith(tuple(ROOMS))
    ]


def test_trainstack_imports_only_itself_but_for_its_entry_point():
    assert app_imports(REPO) == []


def test_the_loop_api_and_its_telemetry_import_neither_the_app_nor_monitoring():
    # The Trainer (train/rank/trainer.py) is a client of trainstack.monitor, as any user's loop is: the API never
    # reaches back up into the app that uses it.
    assert len(within(project_modules(REPO), LOOP_API)) > 10  # the API and the telemetry package were all found
    assert app_imports(REPO, LOOP_API) == []


def test_the_project_has_no_import_cycles():
    graph = import_graph(REPO)
    launch, doctor = "trainstack.commands.train", "trainstack.train.launcher.doctor"
    assert launch in graph and doctor in graph[launch]  # the graph sees real imports
    assert cycles(graph) == []
    assert cycles(subpackage_graph(graph)) == []


def test_a_planted_crossing_is_caught(tmp_path):
    root = plant(
        tmp_path,
        {
            "monitoring/report/__init__.py": "",
            "monitoring/report/runfiles.py": "def load():\n    from trainstack.train.rank.config import X\n",
            "train/launcher/launch.py": "import trainstack.monitoring.report\n",
            "train/launcher/agent.py": "from trainstack.supervisor import lease\n",
            "train/rank/trainer.py": "from trainstack import rundir\n",
            # The supervisor reads the report, never the app; the commands may import every room.
            "supervisor/supervised.py": "from trainstack.monitoring import report\nfrom trainstack.train import rank\n",
            "commands/train.py": "import trainstack.monitoring\nimport trainstack.supervisor\nimport trainstack.train\n",
            "monitoring/diagnose/cli.py": "from trainstack.commands import cli\n",
        },
    )
    assert sorted(crossings(root)) == [
        "trainstack.monitoring.diagnose.cli -> trainstack.commands",
        "trainstack.monitoring.diagnose.cli -> trainstack.commands.cli",
        "trainstack.monitoring.report.runfiles -> trainstack.train.rank.config",
        "trainstack.monitoring.report.runfiles -> trainstack.train.rank.config.X",
        "trainstack.supervisor.supervised -> trainstack.train",
        "trainstack.supervisor.supervised -> trainstack.train.rank",
        "trainstack.train.launcher.agent -> trainstack.supervisor",
        "trainstack.train.launcher.agent -> trainstack.supervisor.lease",
        "trainstack.train.launcher.launch -> trainstack.monitoring.report",
    ]


def test_a_planted_room_import_in_the_ground_is_caught(tmp_path):
    root = plant(
        tmp_path,
        {
            "trainstack/__main__.py": "from trainstack.commands.cli import main\n",
            "trainstack/rundir.py": "def f():\n    from trainstack.supervisor import lease\n",
        },
    )
    assert app_imports(root) == [
        "trainstack.rundir -> trainstack.supervisor",
        "trainstack.rundir -> trainstack.supervisor.lease",
    ]


def test_a_planted_app_import_in_the_telemetry_is_caught(tmp_path):
    root = plant(
        tmp_path,
        {
            "trainstack/telemetry/__init__.py": "",
            "trainstack/telemetry/core.py": "def f():\n    from trainstack.train.rank import step\n",
            "trainstack/__main__.py": "import trainstack.commands.cli\n",
        },
    )
    assert app_imports(root, LOOP_API) == [
        "trainstack.telemetry.core -> trainstack.train.rank",
        "trainstack.telemetry.core -> trainstack.train.rank.step",
    ]


def test_a_planted_cycle_is_caught_through_a_lazy_import(tmp_path):
    root = plant(
        tmp_path,
        {
            "train/launcher/doctor/__init__.py": "from .checks import run\n",
            "train/launcher/doctor/checks.py": "def run():\n    from .. import launch\n",
            "train/launcher/launch.py": "from ..rank import config\nfrom .doctor import run\n",
            "train/rank/config.py": "",
        },
    )
    doctor, launch = "trainstack.train.launcher.doctor", "trainstack.train.launcher.launch"
    assert cycles(import_graph(root)) == [[doctor, f"{doctor}.checks", launch]]


def test_a_planted_loop_between_a_subpackage_and_a_module_is_caught(tmp_path):
    # Each module imports fine (the doctor's package does not import its cli), but the parts loop.
    root = plant(
        tmp_path,
        {
            "train/launcher/doctor/__init__.py": "from .checks import run\n",
            "train/launcher/doctor/checks.py": "",
            "train/launcher/doctor/cli.py": "from trainstack.train.launcher import launch\n",
            "train/launcher/launch.py": "from trainstack.train.launcher.doctor import run\n",
        },
    )
    graph = import_graph(root)
    assert cycles(graph) == []
    assert cycles(subpackage_graph(graph)) == [["trainstack.train.launcher.doctor", "trainstack.train.launcher.launch"]]
