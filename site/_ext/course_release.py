"""The release a site is built from: the repository and version in ``pyproject.toml``.

``[project.urls] Repository`` is the repository's address and ``[project] version`` its version;
the release tag is ``"v" + version``. The setup cell's clone reads the same two values, so the
site's launch buttons open the notebooks of the release the learner installs.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


@dataclass(frozen=True)
class Release:
    repository: str  # https://github.com/ORG/REPO, no trailing slash
    version: str  # 0.1.0

    @property
    def tag(self) -> str:
        return f"v{self.version}"


def release_info(pyproject: Path) -> Release:
    """Read ``[project.urls] Repository`` and ``[project] version``; one line if either is missing."""
    project = tomllib.loads(pyproject.read_text(encoding="utf-8")).get("project", {})
    repository = project.get("urls", {}).get("Repository", "").rstrip("/")
    version = project.get("version", "")
    if not repository.startswith("https://github.com/") or not version:
        raise SystemExit(
            f"{pyproject}: the site needs [project] version and a GitHub address in [project.urls] "
            f"Repository (found version={version!r}, Repository={repository!r})"
        )
    return Release(repository, version)
