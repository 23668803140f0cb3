"""The package build is warning-free (issue 14 item 19).

setuptools warns (and announces it will stop building) when ``project.license`` is a TOML
table, and when a folder that ships package data is not a declared package. Both are read
here from pyproject.toml and the tree, so a new data folder that is not declared fails this
test rather than printing a warning in the build. ``scripts/check-wheel`` builds the wheel
and fails on any warning the build prints.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
SETUPTOOLS = PYPROJECT["tool"]["setuptools"]


def _roots() -> dict[str, Path]:
    """Top-level package name -> its folder (``package-dir`` mappings applied)."""
    mapped = {name: ROOT / d for name, d in SETUPTOOLS.get("package-dir", {}).items()}
    tops = {p.split(".")[0] for p in SETUPTOOLS["packages"]}
    return {t: mapped.get(t, ROOT / t) for t in sorted(tops)}


def test_license_is_an_spdx_string() -> None:
    lic = PYPROJECT["project"]["license"]
    assert isinstance(lic, str), f"project.license must be an SPDX string, not {lic!r}"
    assert re.fullmatch(r"[A-Za-z0-9.+-]+( (AND|OR|WITH) [A-Za-z0-9.+-]+)*", lic), lic
    # PEP 639 license strings need setuptools >= 77.
    req = " ".join(PYPROJECT["build-system"]["requires"])
    m = re.search(r"setuptools>=(\d+)", req)
    assert m is not None and int(m.group(1)) >= 77, req


def test_every_folder_with_files_is_a_declared_package() -> None:
    listed = set(SETUPTOOLS["packages"])
    missing = []
    for top, folder in _roots().items():
        for d in sorted(p for p in folder.rglob("*") if p.is_dir()):
            if "__pycache__" in d.parts or not any(f.is_file() for f in d.iterdir()):
                continue
            name = ".".join((top, *d.relative_to(folder).parts))
            if name not in listed:
                missing.append(name)
    assert not missing, f"declare these folders as packages in pyproject.toml: {missing}"


def test_package_data_names_declared_packages() -> None:
    listed = set(SETUPTOOLS["packages"]) | {"*"}
    for pkg, patterns in SETUPTOOLS["package-data"].items():
        assert pkg in listed, pkg
        # a pattern reaching into a sub-folder means that folder is not a declared package
        assert all("/" not in p for p in patterns), (pkg, patterns)
