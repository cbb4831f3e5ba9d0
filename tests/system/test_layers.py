"""The package's layers import in one direction only, and the wheel installs one import name.

Layers, from the bottom: errors, wire, curve, launch, host, cli, client (see
``envserver/__init__.py``). Each module's imports are read from its source, relative imports
resolved, and checked against what its layer may import; the client and the wire layer are also
imported in a fresh interpreter to see what they load.
"""

from __future__ import annotations

import ast
import functools
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from helpers import ROOT, package_modules
from wheels import build_wheel, copy_sources

import envserver

# What each layer may import of envserver (prefixes); "envserver" alone is the package's face.
ALLOWED: dict[str, tuple[str, ...]] = {
    "envserver.errors": (),
    "envserver.wire": ("envserver.errors", "envserver.wire"),
    "envserver.curve": ("envserver.errors", "envserver.wire", "envserver.curve"),
    # Env state: snapshots of env stacks, carried by the wire layer's codec; the host uses it.
    "envserver.state": ("envserver.errors", "envserver.wire", "envserver.state"),
    "envserver.host": (
        "envserver",
        "envserver.errors",
        "envserver.wire",
        "envserver.curve",
        "envserver.state",
        "envserver.host",
    ),
    # Starting hosts as processes (spawned, forked), and the trainer's settings from the
    # environment: below the command line, which the client never imports (but for its own
    # entry-point plugin), and never loading the host.
    "envserver.launch": ("envserver.errors", "envserver.wire", "envserver.launch"),
    # cli.app runs the host; the rest of the CLI layer is the command line without it.
    "envserver.cli.app": (
        "envserver",
        "envserver.errors",
        "envserver.wire",
        "envserver.curve",
        "envserver.launch",
        "envserver.host",
        "envserver.cli",
    ),
    # The fork server's process runs hosts (cli.app) for the fork server (launch.forkserver).
    "envserver.cli.forkhost": ("envserver.cli.app", "envserver.launch"),
    "envserver.cli": (
        "envserver.errors",
        "envserver.wire",
        "envserver.curve",
        "envserver.launch",
        "envserver.cli.commands",
        "envserver.cli.interrupts",
        "envserver.cli.logs",
        "envserver.cli.settings",
    ),
    "envserver.client": (
        "envserver",
        "envserver.errors",
        "envserver.wire",
        "envserver.curve",
        "envserver.launch",
        "envserver.client",
    ),
    # The client's transport speaks ZeroMQ: never the client's Gymnasium side beside it.
    "envserver.client._transport": (
        "envserver.errors",
        "envserver.wire",
        "envserver.launch",
        "envserver.client._transport",
    ),
    # The client's ``envserver rollout`` command, an entry point of the command line.
    "envserver.client.commands": (
        "envserver",
        "envserver.errors",
        "envserver.wire",
        "envserver.curve",
        "envserver.launch",
        "envserver.cli.commands",
        "envserver.cli.interrupts",
        "envserver.cli.settings",
        "envserver.client",
    ),
    # Env families of other packages as Gymnasium envs: nothing of envserver.
    "envserver.envs": ("envserver.envs",),
    "envserver.testing": ("envserver.launch.spawn", "envserver.testing"),
    "envserver.conformance": (
        "envserver.errors",
        "envserver.wire",
        "envserver.curve",
        "envserver.testing",
        "envserver.conformance",
    ),
    # The benchmark: the client against Gymnasium's vector envs, a contributed command.
    "envserver.bench": (
        "envserver.wire.messages",
        "envserver.wire.batching",
        "envserver.cli.commands",
        "envserver.cli.interrupts",
        "envserver.cli.settings",
        "envserver.testing",
        "envserver.client",
        "envserver.bench",
    ),
    "envserver.__main__": ("envserver.cli.app",),
    "envserver": ("envserver.errors", "envserver.wire.messages"),
}


def imports_of(module: str, path: Path) -> list[tuple[int, str]]:
    """The envserver modules (or names in them) one module imports, with their lines."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            found += [(node.lineno, f"{base}.{alias.name}") for alias in node.names]
    return [(line, name) for line, name in found if name.split(".")[0] == "envserver"]


def layer_of(module: str) -> str:
    """The most specific key of ALLOWED that the module falls under."""
    keys = [k for k in ALLOWED if module == k or module.startswith(k + ".")]
    return max(keys, key=len)


def allowed(name: str, prefixes: tuple[str, ...]) -> bool:
    """Whether an imported name (``envserver.wire.codec``, ``envserver.__version__``) may be."""
    for prefix in prefixes:
        if prefix == "envserver":  # the package itself, or a name it exports
            if name == "envserver" or name.removeprefix("envserver.") in envserver.__all__:
                return True
        elif name == prefix or name.startswith(prefix + "."):
            return True
    return False


def test_every_layer_imports_only_what_it_may():
    modules = package_modules()
    assert {"envserver.wire.messages", "envserver.host.loop", "envserver.client._vector"} <= set(
        modules
    )
    broken = [
        f"{path.relative_to(ROOT)}:{line}: {module} ({layer_of(module)}) imports {name}"
        for module, path in modules.items()
        for line, name in imports_of(module, path)
        if not allowed(name, ALLOWED[layer_of(module)])
    ]
    assert broken == []


def test_the_checker_finds_an_upward_import(tmp_path):
    # The test above would pass on a checker that finds nothing: this one must find something.
    path = tmp_path / "codec.py"
    path.write_text("from envserver.host.loop import EnvHost\nfrom ..errors import ProtocolError\n")
    imports = imports_of("envserver.wire.codec", path)
    assert imports == [(1, "envserver.host.loop.EnvHost"), (2, "envserver.errors.ProtocolError")]
    assert [allowed(name, ALLOWED["envserver.wire"]) for _, name in imports] == [False, True]
    assert not allowed("envserver.host.loop", ALLOWED["envserver.client"])
    assert allowed("envserver.__version__", ALLOWED["envserver.client"])
    assert allowed("envserver", ALLOWED["envserver.client"])
    assert not allowed("envserver", ALLOWED["envserver.wire"])
    assert layer_of("envserver.cli.app") == "envserver.cli.app"
    assert layer_of("envserver.launch.spawn") == "envserver.launch"
    assert not allowed("envserver.cli.app", ALLOWED["envserver.cli"])
    assert not allowed("envserver.cli.settings", ALLOWED["envserver.client"])
    assert allowed("envserver.cli.settings", ALLOWED[layer_of("envserver.client.commands")])


def test_the_client_transport_imports_no_gymnasium():
    # The seam inside the client: its transport part is read and tested without Gymnasium.
    modules = {
        m: p for m, p in package_modules().items() if layer_of(m) == "envserver.client._transport"
    }
    assert {"envserver.client._transport.pool", "envserver.client._transport.raw_step"} <= set(
        modules
    )
    gymnasium = [
        f"{path.relative_to(ROOT)}:{node.lineno}"
        for path in modules.values()
        for node in ast.walk(ast.parse(path.read_text()))
        for name in (
            [a.name for a in node.names]
            if isinstance(node, ast.Import)
            else [node.module or ""]
            if isinstance(node, ast.ImportFrom) and not node.level
            else []
        )
        if name.split(".")[0] == "gymnasium"
    ]
    assert gymnasium == []
    assert not allowed("envserver.client._lockstep", ALLOWED["envserver.client._transport"])


def loaded_after(code: str) -> list[str]:
    """The envserver modules a fresh interpreter has loaded after running ``code``."""
    script = (
        f"{code}\nimport sys\nprint(*sorted(m for m in sys.modules if m.startswith('envserver')))"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=ROOT
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.split()


def test_the_client_never_loads_the_host():
    loaded = loaded_after(
        "import envserver.client, envserver.client.sb3, envserver.client.commands"
    )
    assert "envserver.client._vector" in loaded
    assert [m for m in loaded if m.startswith("envserver.host") or m == "envserver.cli.app"] == []


def test_the_benchmark_never_loads_the_host_and_its_envs_load_no_client():
    loaded = loaded_after("import envserver.bench.run")
    assert {"envserver.bench.chart", "envserver.client._vector"} <= set(loaded)
    assert [m for m in loaded if m.startswith("envserver.host") or m == "envserver.cli.app"] == []
    # A host makes envserver.bench.envs:bench/Compute-v0: that import loads no client.
    assert [m for m in loaded_after("import envserver.bench.envs") if ".client" in m] == []


def test_the_wire_layer_loads_nothing_above_it():
    loaded = loaded_after(
        "import importlib, pkgutil, envserver.wire as w\n"
        "for m in pkgutil.iter_modules(w.__path__):\n"
        "    importlib.import_module('envserver.wire.' + m.name)"
    )
    assert "envserver.wire.reach" in loaded
    above = ("envserver.host", "envserver.curve", "envserver.cli", "envserver.client")
    assert [m for m in loaded if m.startswith(above)] == []


def test_nothing_imports_the_bare_client_package():
    # The repository root is on sys.path during tests, so `import client` would load a second
    # copy of every class unnoticed; strings naming its modules (monkeypatch targets, logger
    # names, entry points) would miss the real ones.
    sources = [
        *ROOT.glob("tests/**/*.py"),
        *ROOT.glob("benchmarks/*.py"),
        *ROOT.glob("examples/*.py"),
    ]
    sources += list(package_modules().values())
    bare = [
        f"{path.relative_to(ROOT)}:{node.lineno}"
        for path in sources
        for node in ast.walk(ast.parse(path.read_text()))
        if (
            isinstance(node, ast.Import)
            and any(a.name.split(".")[0] == "client" for a in node.names)
        )
        or (
            isinstance(node, ast.ImportFrom)
            and not node.level
            and (node.module or "").split(".")[0] == "client"
        )
    ]
    named = [
        f"{path.relative_to(ROOT)}: {match.group(0)}"
        for path in sources
        for match in re.finditer(r"""["']client(\.(?!py["'])[\w.:]+|:\w+)["']""", path.read_text())
    ]
    assert bare == [] and named == []
    assert "client" not in sys.modules  # every test module of this worker is imported by now


@pytest.mark.slow
def test_the_wheel_installs_envserver_alone(tmp_path):
    wheel = build_wheel(tmp_path)
    assert wheel.name.startswith(f"envserver-{envserver.__version__}-")  # read from the package
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        (top_level,) = [n for n in names if n.endswith(".dist-info/top_level.txt")]
        assert archive.read(top_level).decode().split() == ["envserver"]
        (entry_points,) = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
        assert "bench = envserver.bench.run:bench" in archive.read(entry_points).decode()
    assert "envserver/client/__init__.py" in names
    assert "envserver/client/py.typed" in names
    assert "envserver/client/_transport/pool.py" in names
    assert "envserver/wire/messages.py" in names
    assert "envserver/bench/run.py" in names and "envserver/bench/envs.py" in names
    assert {n.split("/")[0] for n in names if ".dist-info/" not in n} == {"envserver"}


TRAINER = """
from envserver import client

envs = client.make_vec("CartPole-v1", num_envs=2)
observations, _ = envs.reset(seed=3)
envs.step(envs.action_space.sample())
envs.close()
print("trainer ok", type(envs).__module__, observations.shape)
"""


@pytest.mark.slow
def test_a_trainer_directory_with_its_own_client_module(tmp_path):
    # A user's client.py and a client/ folder (a web front end, say) beside the trainer.
    (tmp_path / "client.py").write_text("raise RuntimeError('the user's own client.py')\n")
    (tmp_path / "client").mkdir()
    (tmp_path / "client" / "index.html").write_text("<html></html>\n")
    (tmp_path / "train.py").write_text(TRAINER)
    runs = {
        "trainer": [sys.executable, "train.py"],
        "rollout": [
            sys.executable,
            "-m",
            "envserver",
            "--log-level",
            "WARNING",
            "rollout",
            "CartPole-v1",
            "--num-envs",
            "2",
            "--steps",
            "20",
        ],
    }
    for name, command in runs.items():
        result = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=300)
        assert result.returncode == 0, (name, result.stderr)
        runs[name] = result.stdout
    assert "trainer ok envserver.client._vector (2, 4)" in runs["trainer"]
    assert "episodes finished" in runs["rollout"]


def test_a_checkout_on_pythonpath_runs_its_own_client_or_none(tmp_path):
    # Another checkout's envserver on PYTHONPATH, beside this checkout's editable install: its
    # envserver.client would be this checkout's, so the client refuses to mix the two trees.
    checkout = tmp_path / "checkout"
    checkout.mkdir()
    copy_sources(checkout)
    code = "import envserver.client as c; print(c.__file__)"
    run = functools.partial(
        subprocess.run,
        [sys.executable, "-c", code],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(checkout)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    mixed = run()
    assert mixed.returncode == 1 and "two source trees" in mixed.stderr, mixed.stderr
    (checkout / "envserver" / "client").symlink_to("../client")
    linked = run()
    assert linked.returncode == 0, linked.stderr
    assert linked.stdout.strip() == str(checkout / "envserver" / "client" / "__init__.py")
