"""Helpers the tests import to build the project's wheel and install it where a user would."""

from __future__ import annotations

import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

from helpers import CLIENT, ROOT


def copy_sources(directory: Path) -> None:
    """Copies envserver/ and client/ into ``directory``, without a link to the client inside
    envserver/ (the A/B benchmark set-up makes one) or bytecode."""
    skip = shutil.ignore_patterns("__pycache__", "client")
    shutil.copytree(ROOT / "envserver", directory / "envserver", ignore=skip)
    shutil.copytree(CLIENT, directory / "client", ignore=shutil.ignore_patterns("__pycache__"))


def build_wheel(directory: Path) -> Path:
    """Builds the wheel of this checkout's sources (copied first) into ``directory / "dist"``.

    ``pip wheel --no-deps --no-build-isolation``: offline, with this venv's setuptools.
    """
    source = directory / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        (source / name).write_bytes((ROOT / name).read_bytes())
    copy_sources(source)
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "--quiet",
            "--wheel-dir",
            str(directory / "dist"),
            str(source),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    (wheel,) = (directory / "dist").glob("envserver-*.whl")
    return wheel


def venv_with_wheel(directory: Path, wheel: Path) -> Path:
    """A new venv at ``directory`` with ``wheel`` installed; returns its ``bin`` directory.

    The dependencies are this venv's, made visible by a ``.pth`` line naming its site-packages:
    a line only adds the path (the editable install's finder there does not run), so the
    ``envserver`` imported is the wheel's.
    """
    # Without its own pip (installing one takes seconds): the .pth line below lends it ours.
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(directory)], check=True, timeout=300
    )
    python = directory / "bin" / "python"
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout.strip()
    (Path(purelib) / "project-venv.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    result = subprocess.run(
        [str(python), "-m", "pip", "install", "--no-deps", "--no-index", "--quiet", str(wheel)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    return directory / "bin"
