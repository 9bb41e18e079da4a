"""What --model and --dataset name, checked before any rank starts: built-in models (their shapes) and data (their
vocabulary), `module:function` factories, local files. torch-free: the launcher and its doctor read all of this,
and importing torch there would cost every launch seconds of CPU before a rank could start. So a factory is checked
from its module's source (`check_factory`), and only each rank imports it (`load_factory`)."""

from __future__ import annotations

import ast
import importlib
import importlib.util
from dataclasses import dataclass
from importlib.machinery import ModuleSpec
from pathlib import Path

from trainstack.errors import ConfigError

BUILTIN_PREFIX = "builtin:"
BUILTIN_VOCAB = 64  # every built-in dataset's tokens are 0..63
BUILTIN_DATASET_NAMES = ("sequences", "full-sequences")
LOCAL_BUILDERS = {".txt": "text", ".json": "json", ".jsonl": "json", ".parquet": "parquet", ".csv": "csv"}


@dataclass(frozen=True)
class GPTShape:
    layers: int
    heads: int
    width: int

    def parameter_count(self, vocab_size: int, max_len: int) -> int:
        """The parameters of model.GPT of this shape, the tied output projection once (tests/unit/train/test_doctor.py
        checks it against every built model, so the two cannot drift)."""
        width = self.width
        norms = 2 * 2 * width  # two LayerNorms, weight and bias
        attention = (3 * width * width + 3 * width) + (width * width + width)
        mlp = (4 * width * width + 4 * width) + (4 * width * width + width)
        embeddings = vocab_size * width + max_len * width
        return embeddings + self.layers * (norms + attention + mlp) + 2 * width


BUILTIN_MODELS = {
    "tiny-gpt": GPTShape(layers=2, heads=4, width=128),
    "small-gpt": GPTShape(6, 8, 512),
    "gpt2-small": GPTShape(12, 12, 768),  # GPT-2 124M's shape; the CUDA default
}


def load_factory(spec: str, what: str):
    """Import `module:function`; a failure is the user's input, so it becomes one line, not a traceback."""
    module_name, _, attribute = spec.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise ConfigError(
            f"cannot import {what} factory module {module_name!r} ({error}); check the name and that it is on "
            "PYTHONPATH"
        ) from None
    except Exception as error:  # noqa: BLE001 - the user's module failed as it loaded: its error, in one line
        said = (str(error).splitlines() or [""])[0]
        raise ConfigError(
            f"{what} factory module {module_name!r} failed as it was imported: {type(error).__name__}: {said}"
        ) from None
    factory = getattr(module, attribute, None)
    if factory is None:
        raise ConfigError(f"{what} factory {spec!r}: module {module_name!r} has no function {attribute!r}")
    if not callable(factory):
        raise ConfigError(f"{what} factory {spec!r}: {attribute!r} in module {module_name!r} is not a function")
    return factory


def check_factory(spec: str, what: str) -> None:
    """That `module:function` names something in its module, read from the module's source without running it: a
    model's module imports torch, seconds of CPU before a rank could start. Where the source does not settle it (no
    Python source to read, or no top-level binding of the name: a module may make names at run time), the module is
    imported, as each rank will, for load_factory's answer. What the source cannot show, an error the module raises
    as it loads or a name that is no function, each rank says in its one line."""
    module_name, _, attribute = spec.partition(":")
    try:
        found = importlib.util.find_spec(module_name)  # imports the parent packages only, as an import would
    except Exception:  # noqa: BLE001 - a parent package missing or failing: load_factory's line says which
        found = None
    source = _python_source(found)
    if source is None:
        load_factory(spec, what)
        return
    try:
        tree = ast.parse(source[1], filename=source[0])
    except (SyntaxError, ValueError):  # the import's own error, in load_factory's words
        load_factory(spec, what)
        return
    if attribute not in _top_level_names(tree):
        load_factory(spec, what)


def _python_source(found: ModuleSpec | None) -> tuple[str, str] | None:
    """(the module's file, its text), where it is a Python source file that can be read."""
    if found is None or not found.origin or not found.origin.endswith(".py"):
        return None
    try:
        return found.origin, Path(found.origin).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None


def _top_level_names(tree: ast.Module) -> set[str]:
    """The names the module's top level binds by name (in its if, try, with and for blocks too); a star import's
    or a module `__getattr__`'s names only the import finds."""
    names: set[str] = set()
    pending: list[ast.AST] = list(tree.body)
    while pending:
        node = pending.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
            continue  # what a body binds is its own scope's
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update(alias.asname or alias.name.partition(".")[0] for alias in node.names)
            continue
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        if not isinstance(node, (ast.Lambda, ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)):
            pending.extend(ast.iter_child_nodes(node))
    return names


def is_factory(spec: str) -> bool:
    module_name, sep, attribute = spec.partition(":")
    return (
        bool(sep)
        and not spec.startswith(BUILTIN_PREFIX)
        and all(part.isidentifier() for part in module_name.split("."))
        and attribute.isidentifier()
    )


def check_dataset_spec(spec: str) -> None:
    """Everything about the dataset that can be checked before ranks start."""
    if spec.startswith(BUILTIN_PREFIX):
        name = spec[len(BUILTIN_PREFIX) :]
        if name not in BUILTIN_DATASET_NAMES:
            raise ConfigError(
                f"unknown built-in dataset {spec!r}; choose one of "
                + ", ".join(BUILTIN_PREFIX + n for n in BUILTIN_DATASET_NAMES)
            )
    elif is_factory(spec):
        check_factory(spec, "dataset")
    elif looks_like_path(spec):
        local_data_files(Path(spec).expanduser())


def looks_like_path(spec: str) -> bool:
    # "org/name" is a hub name unless it exists here; a data-file suffix or ./ ~ / marks a path either way.
    return Path(spec).expanduser().exists() or spec.startswith((".", "/", "~")) or Path(spec).suffix in LOCAL_BUILDERS


def local_data_files(path: Path) -> tuple[str, list[str]]:
    if not path.exists():
        raise ConfigError(f"dataset path {path} does not exist; pass an existing file or folder to --dataset")
    files = sorted(p for p in path.rglob("*") if p.suffix in LOCAL_BUILDERS) if path.is_dir() else [path]
    if not files or any(p.suffix not in LOCAL_BUILDERS for p in files):
        raise ConfigError(f"dataset {path}: no readable data; use .txt, .json, .jsonl, .parquet or .csv files")
    builders = {LOCAL_BUILDERS[p.suffix] for p in files}
    if len(builders) > 1:
        raise ConfigError(f"dataset folder {path} mixes file types; keep one of {sorted(LOCAL_BUILDERS)}")
    return builders.pop(), [str(p) for p in files]


def check_model_spec(spec: str) -> None:
    if spec.startswith(BUILTIN_PREFIX):
        if spec[len(BUILTIN_PREFIX) :] not in BUILTIN_MODELS:
            raise ConfigError(
                f"unknown built-in model {spec!r}; choose one of "
                + ", ".join(BUILTIN_PREFIX + n for n in BUILTIN_MODELS)
                + " or give a module:function factory"
            )
    elif is_factory(spec):
        check_factory(spec, "model")
    else:
        raise ConfigError(
            f"--model {spec!r} is neither builtin:NAME nor module:function; e.g. builtin:tiny-gpt or "
            "mypackage.models:build"
        )
