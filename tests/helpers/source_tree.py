"""The project's source folders read as the modules they install as, and scratch trees planted to look like them."""

from __future__ import annotations

from pathlib import Path

# Source folder -> the package it installs as (pyproject.toml's package-dir).
LAYOUT = {
    "trainstack": "trainstack",
    "train": "trainstack.train",
    "monitoring": "trainstack.monitoring",
    "supervisor": "trainstack.supervisor",
    "commands": "trainstack.commands",
}


def within_any(module: str, packages: tuple[str, ...]) -> bool:
    return any(module == package or module.startswith(package + ".") for package in packages)


def project_modules(root: Path, layout=LAYOUT) -> dict[str, Path]:
    """Dotted module name -> file, for every Python file of the source folders (a package is its __init__)."""
    modules = {}
    for folder, package in layout.items():
        for path in sorted((root / folder).rglob("*.py")):
            parts = (*package.split("."), *path.relative_to(root / folder).with_suffix("").parts)
            modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def plant(root: Path, files: dict[str, str]) -> Path:
    for name, text in {**{f"{p}/__init__.py": "" for p in LAYOUT}, **files}.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root
