"""Which of diagnose's verdicts read each series, found in diagnose's code rather than kept beside each catalog
entry.

Diagnose reads series in one place and judges in another: monitoring/diagnose/snapshot.py fills the fields of its
views (RankView, GpuView, GpuProcess, Snapshot) from the series, and each check of monitoring/diagnose/verdicts.py
reads those fields and writes `Verdict(kind, ...)`. So a verdict kind reads a series when a check that writes it
(with the helpers it calls and the view properties it uses) reads a field filled from that series:
- a field reads the series (catalog entries, trainstack/ratios.py figures) of the expression that fills it,
  through the local names that expression is built from; a loop's key (a rank, a GPU's uuid) only names a view;
- a view list (Snapshot.ranks, .gpus, .processes) read by a check reads the series that decide which views exist;
- a check reads a field by its name, on the views whose list it reads;
- an exporter source times the rates of the GPU counters the exporter reads at its slow cadence by the series its
  own code reads (monitoring/diagnose/sources.py: the exporter's slow reads), so a field filled from a slow counter
  reads those too.
What diagnose shows besides the verdicts, its `figures` and `notes`, reads as kinds of their own.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
from collections.abc import Iterator
from types import ModuleType

from trainstack import catalog
from trainstack.monitoring.diagnose import snapshot, sources, verdicts

# verdicts.py's functions whose output diagnose shows besides the verdicts.
OUTPUTS = ("figures", "notes")
VIEWS = {
    name: view
    for name, view in vars(snapshot).items()
    if inspect.isclass(view) and dataclasses.is_dataclass(view) and view.__module__ == snapshot.__name__
}
# Snapshot's fields that hold views -> the view they hold.
LISTS = {
    field.name: view
    for field in dataclasses.fields(snapshot.Snapshot)
    for view in VIEWS
    if view != "Snapshot" and view in str(field.type)
}
COMPREHENSIONS = (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)


def _value(node: ast.expr, module: ModuleType) -> object:
    """What a module-level name or attribute chain (`catalog.TRAIN_STEPS.name`) is; None for anything else."""
    if isinstance(node, ast.Attribute):
        return getattr(_value(node.value, module), node.attr, None)
    if isinstance(node, ast.Name):
        return vars(module).get(node.id)
    return None


def _series(value: object) -> set[str]:
    """The catalog entries a value names: a metric, a series name, or a ratio's series."""
    if isinstance(value, catalog.Metric):
        return {value.name}
    if isinstance(value, str):
        return {catalog.ENTRY_OF_SERIES[value]} if value in catalog.ENTRY_OF_SERIES else set()
    named = getattr(value, "series", ())
    return (
        {catalog.ENTRY_OF_SERIES[name] for name in named if name in catalog.ENTRY_OF_SERIES}
        if isinstance(named, tuple)
        else set()
    )


def _bound(target: ast.expr) -> list[str]:
    return [node.id for node in ast.walk(target) if isinstance(node, ast.Name)]


def _functions(module: ModuleType) -> dict[str, ast.FunctionDef]:
    tree = ast.parse(inspect.getsource(module))
    return {node.name: node for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)}


class _Reads:
    """The series an expression of a module reads: through local names, and the module's functions it calls."""

    def __init__(self, module: ModuleType):
        self.module = module
        self.functions = _functions(module)
        self._of_function: dict[str, set[str]] = {}

    def function(self, name: str) -> set[str]:
        if name not in self._of_function:
            self._of_function[name] = set()  # a recursive call adds nothing
            self._of_function[name] = self.of(self.functions[name], {})
        return self._of_function[name]

    def of(self, node: ast.AST, names: dict[str, set[str]]) -> set[str]:
        if isinstance(node, ast.Name) and node.id in names:
            return names[node.id]
        if isinstance(node, (ast.Name, ast.Attribute)) and (found := _series(_value(node, self.module))):
            return found
        if isinstance(node, COMPREHENSIONS):
            names = self.comprehension(node, names)
            parts: list[ast.AST] = [node.key, node.value] if isinstance(node, ast.DictComp) else [node.elt]
            parts += [condition for generator in node.generators for condition in generator.ifs]
            return set().union(*(self.of(part, names) for part in parts))
        found = set()
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in self.functions:
            found |= self.function(node.func.id)
        for child in ast.iter_child_nodes(node):
            found |= self.of(child, names)
        return found

    def comprehension(self, node: ast.AST, names: dict[str, set[str]]) -> dict[str, set[str]]:
        """The names a comprehension binds, each to the series of what it iterates over."""
        names = dict(names)
        for generator in getattr(node, "generators", ()):
            iterated = self.of(generator.iter, names)
            names.update(dict.fromkeys(_bound(generator.target), iterated))
        return names

    def local_names(self, function: ast.FunctionDef) -> tuple[dict[str, set[str]], dict[str, ast.expr]]:
        """A function's local names -> the series each holds, and the expression each was assigned. A loop's
        first target is its key (a rank, a uuid) and holds none; the others hold what the loop iterates over."""
        names: dict[str, set[str]] = {}
        assigned: dict[str, ast.expr] = {}
        for _ in range(2):  # ast.walk reaches a nested block's assignments after the outer ones that may read them
            for node in ast.walk(function):
                if isinstance(node, ast.Assign | ast.AnnAssign) and node.value is not None:
                    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                    for name in (name for target in targets for name in _bound(target)):
                        names[name] = names.get(name, set()) | self.of(node.value, names)
                        assigned[name] = node.value
                elif isinstance(node, ast.For) and isinstance(node.target, ast.Tuple):
                    for name in (name for target in node.target.elts[1:] for name in _bound(target)):
                        names[name] = names.get(name, set()) | self.of(node.iter, names)
        return names, assigned


def _enclosing(function: ast.FunctionDef, call: ast.Call) -> list[ast.For | ast.comprehension]:
    """The loops and comprehension clauses of the function that hold the call, outermost first."""
    holding: list[ast.For | ast.comprehension] = []
    for node in ast.walk(function):
        if isinstance(node, ast.For | ast.ListComp | ast.SetComp | ast.DictComp | ast.GeneratorExp):
            if node is not call and call in set(ast.walk(node)):
                holding += [node] if isinstance(node, ast.For) else node.generators
    return holding


def view_fields() -> tuple[dict[tuple[str, str], set[str]], dict[str, set[str]]]:
    """(view, field) -> the series that fill it, and view -> the series that decide which of its views exist."""
    reads = _Reads(snapshot)
    slow_counters = set().union(*(_series(name) for name in sources.SLOW_GPU_COUNTERS))
    source_reads = _Reads(sources)
    source_functions = ast.walk(ast.parse(inspect.getsource(sources)))
    slow_reads = set().union(
        *(source_reads.of(node, {}) for node in source_functions if isinstance(node, ast.FunctionDef))
    )
    fields: dict[tuple[str, str], set[str]] = {}
    exist: dict[str, set[str]] = {}
    for function in reads.functions.values():
        names, assigned = reads.local_names(function)
        for call in ast.walk(function):
            if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id in VIEWS):
                continue
            view = call.func.id
            scope = dict(names)
            for loop in _enclosing(function, call):
                exist.setdefault(view, set()).update(reads.of(loop.iter, scope))
                if isinstance(loop, ast.comprehension):
                    scope.update(dict.fromkeys(_bound(loop.target), reads.of(loop.iter, scope)))
            for field, series in _arguments(reads, view, call, scope, assigned):
                fields.setdefault((view, field), set()).update(series)
                if series & slow_counters:
                    fields[view, field] |= slow_reads
    return fields, exist


def _arguments(
    reads: _Reads, view: str, call: ast.Call, names: dict[str, set[str]], assigned: dict[str, ast.expr]
) -> Iterator[tuple[str, set[str]]]:
    """(field, series) for each argument of a view's constructor. A `**{...}` argument fills the fields named by
    the (field, series) pairs it is built from, or by a catalog tuple of field names (catalog.GPU_LINK_LABELS)."""
    fields = [field.name for field in dataclasses.fields(VIEWS[view])]
    for position, argument in enumerate(call.args):
        yield fields[position], reads.of(argument, names)
    for keyword in call.keywords:
        if keyword.arg:
            yield keyword.arg, reads.of(keyword.value, names)
            continue
        built_from = [keyword.value] + [
            assigned[node.id] for node in ast.walk(keyword.value) if isinstance(node, ast.Name) and node.id in assigned
        ]
        pairs = [
            (str(node.elts[0].value), node.elts[1])
            for expression in built_from
            for node in ast.walk(expression)
            if isinstance(node, ast.Tuple)
            and len(node.elts) == 2
            and isinstance(node.elts[0], ast.Constant)
            and node.elts[0].value in fields
        ]
        for field, expression in pairs:
            yield field, reads.of(expression, names)
        if not pairs:
            for node in ast.walk(keyword.value):
                named = _value(node, reads.module) if isinstance(node, ast.Attribute) else None
                for field in set(named if isinstance(named, tuple) else ()) & set(fields):
                    yield field, reads.of(keyword.value, names)


def _members() -> dict[str, set[str]]:
    """A view's properties and methods -> the attribute names their bodies read."""
    tree = ast.parse(inspect.getsource(snapshot))
    return {
        member.name: {node.attr for node in ast.walk(member) if isinstance(node, ast.Attribute)}
        for view in tree.body
        if isinstance(view, ast.ClassDef) and view.name in VIEWS
        for member in view.body
        if isinstance(member, ast.FunctionDef)
    }


def _kinds(check: ast.FunctionDef) -> list[str]:
    """The kinds a check writes: the first argument of each of its `Verdict(...)`s."""
    written = (
        node.args[0]
        for node in ast.walk(check)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "Verdict"
    )
    kinds = [kind.value if isinstance(kind, ast.Constant) else _value(kind, verdicts) for kind in written]
    return [kind for kind in kinds if isinstance(kind, str)]


def _used(name: str, functions: dict[str, ast.FunctionDef], members: dict[str, set[str]]) -> set[str]:
    """The attribute names a function of verdicts.py reads, with the functions it calls and the view members those
    use. An attribute of a module-level object (`catalog.TRAIN_LAST_STEP.name`) is no view's."""
    used: set[str] = set()
    calls, seen = [name], {name}
    while calls:
        for node in ast.walk(functions[calls.pop()]):
            if isinstance(node, ast.Attribute) and _value(node.value, verdicts) is None:
                used.add(node.attr)
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in functions:
                calls += [node.func.id] if node.func.id not in seen else []
                seen.add(node.func.id)
    while extra := set().union(*(members.get(attribute, set()) for attribute in used)) - used:
        used |= extra
    return used


@functools.cache
def diagnose_readers() -> dict[str, tuple[str, ...]]:
    """Catalog entry name -> the verdict kinds (and `figures`, `notes`) that read it, in verdicts.py's order."""
    fields, exist = view_fields()
    functions = _functions(verdicts)
    members = _members()
    readers: dict[str, dict[str, None]] = {}
    for name, check in functions.items():
        kinds = _kinds(check) or ([name] if name in OUTPUTS else [])
        if not kinds:
            continue
        used = _used(name, functions, members)
        lists = {LISTS[attribute] for attribute in used if attribute in LISTS}
        read = set().union(*(exist.get(view, set()) for view in lists))
        for (view, field), filled_from in fields.items():
            if view in lists | {"Snapshot"} and field in used and field not in LISTS:
                read |= filled_from
        for series in read:
            readers.setdefault(series, {}).update(dict.fromkeys(kinds))
    return {series: tuple(kinds) for series, kinds in readers.items()}
