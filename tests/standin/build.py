"""Build the stand-in ``libnvidia-ml.so.1`` (nvml_standin.c) with the system's C compiler."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

SOURCE = Path(__file__).with_name("nvml_standin.c")


def build_nvml_standin(folder: Path) -> Path:
    """Compile the stand-in into ``folder/libnvidia-ml.so.1``; the folder (for
    ``LD_LIBRARY_PATH``: nvidia-ml-py dlopens the library by that name). Skips the test when no
    C compiler is installed (Debian package ``gcc``)."""
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        pytest.skip("no C compiler (Debian package gcc) to build the stand-in NVML library")
    folder.mkdir(parents=True, exist_ok=True)
    out = folder / "libnvidia-ml.so.1"
    subprocess.run([cc, "-shared", "-fPIC", "-O1", "-Wall", "-Werror", "-o", str(out),
                    str(SOURCE)], check=True, capture_output=True, timeout=60)
    return folder
