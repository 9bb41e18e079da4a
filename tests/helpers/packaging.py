"""What keeps trainstack from installing beside a user's stack, or its lock from installing it."""

from __future__ import annotations

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name


def problems(requirements: list[Requirement], pins: dict[str, str]) -> list[str]:
    """What keeps the package from installing beside a user's stack, or the lock from installing it."""
    found = []
    for requirement in requirements:
        name = canonicalize_name(requirement.name)
        if any(spec.operator in ("==", "===") for spec in requirement.specifier):
            found.append(f"{requirement} pins one version")
        elif not requirement.specifier:
            found.append(f"{requirement.name} states no range")
        if name not in pins:
            found.append(f"{requirement.name} is not in requirements.lock")
        elif not requirement.specifier.contains(pins[name], prereleases=True):
            found.append(f"requirements.lock pins {name}=={pins[name]}, outside {requirement.specifier}")
    return found
