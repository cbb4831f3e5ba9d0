"""The benchmark stays runnable: short smoke runs of ``envserver bench`` (its numbers are
not checked: timing assertions have no place in a test on a shared machine), from this checkout
and from its wheel installed in a fresh venv, with and without matplotlib for the chart."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
from helpers import ROOT
from wheels import build_wheel, venv_with_wheel

from envserver.bench import chart, envs, floors, report, run, startup, variants, workloads
from envserver.cli.app import main
from envserver.cli.interrupts import signals_interrupt

#: Whole programs under test: `make test-long` (CI) runs them.
pytestmark = pytest.mark.long

BENCH = [sys.executable, "-m", "envserver", "bench"]
SB3_INSTALLED = importlib.util.find_spec("stable_baselines3") is not None
PUFFERLIB_INSTALLED = importlib.util.find_spec("pufferlib") is not None
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
#: One round of 0.01 s per variant (its warm-up as short): the reports' sections are read, not
#: numbers.
ONE_SHORT_ROUND = ["--rounds", "1", "--round-seconds", "0.01"]
#: A run of a few seconds: one env of the benchmark's own (which hosts make from its module
#: prefix), 2 envs on 1 host over ipc, one short round.
SHORT_OWN_ENV = [
    "--quick",
    "--env",
    envs.COMPUTE_ID,
    "--env-kwargs",
    '{"work": 100}',
    "--num-envs",
    "2",
    "--hosts",
    "1",
    "--transports",
    "ipc",
    *ONE_SHORT_ROUND,
]
#: The standard workloads' runs: one short round per variant and a short soak.
SHORT = [*ONE_SHORT_ROUND, "--soak-steps", "500"]
#: The quick run's first-ready batches (on remote and on local hosts).
QUICK_BATCH = ["--batch-size", "2"]
#: The tests that read one run's report share a worker (make test's), which makes the run once.
QUICK_RUN = pytest.mark.xdist_group("bench-quick-run")
OWN_ENV_RUN = pytest.mark.xdist_group("bench-own-env-run")


def run_bench(out: Path, *options: str, **kwargs) -> subprocess.CompletedProcess:
    """``envserver bench --out out *options`` in ``out``'s directory, which must succeed."""
    result = subprocess.run(
        [*BENCH, "--out", str(out), *options],
        capture_output=True,
        text=True,
        timeout=480,
        cwd=out.parent,  # a user's directory, not the checkout
        **kwargs,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def quick_report(out: Path, *options: str) -> str:
    """The report of ``envserver bench --quick --out out *options``, which must succeed."""
    run_bench(out, "--quick", *options)
    return out.read_text()


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The report of one quick run, every section: the next tests read it, each a part.

    (``--only`` and ``--skip`` run in the interrupted benchmark's test and in the refusals.)
    """
    out = tmp_path_factory.mktemp("quick") / "report.md"
    return quick_report(out, *SHORT, *QUICK_BATCH)


@QUICK_RUN
@pytest.mark.slow
@pytest.mark.timeout(600)  # with the run: one a third as long took 116 s on a loaded box
def test_quick_benchmark_writes_its_report(quick_run):
    report = quick_run
    assert "failed:" not in report
    for heading in (
        "**Echo floor this run:",
        "### One env: step round trip",
        "### CartPole-v1, 4 envs",
        "| Remote ipc 1 host |",
        "| AsyncVectorEnv shm |",
        "| raw ZeroMQ floor ipc 1 host |",
        "| Remote ipc 1 host, env output off |",
        "peak RSS of each env host (MB) |",
        "Remote first-ready, batches of 2",
        "| Remote ipc 1 host, first-ready batches of 2 |",
        "| make_vec (local hosts), no options, batch_size=2 |",
        "### Soak:",
        "### Targets",
        "| 1 ms-step env, 16 envs, Remote embedded default / best "
        "AsyncVectorEnv | n/a | >= 0.9 | - |",  # 16 envs: not in --quick
        "| 1 ms-step env (sleeps): defaults, 16 envs, make_vec no options / AsyncVectorEnv "
        "defaults |",
        "| start-up, 4 envs, make_vec / AsyncVectorEnv default context (time) |",
        "| (context) start-up first in a fresh process, 16 envs (time) |",
        "| one env step / echo floor (ipc) |",
        "### One env on this machine: step round trip",
        "| SyncVectorEnv (in process) |",
        "| make_vec, one local host |",
        "| one env round trip, make_vec, one local host / PufferLib Multiprocessing, 1 worker "
        "x 1 |",
        "| (context) one env round trip, make_vec, one local host / SyncVectorEnv (in process) |",
        "### multi-agent: MPE simple_spread, 8 agents (agent-steps), 16 envs",
        "| reference loop (in process) |",
        "| SuperSuit concat_vec_envs_v1, 2 processes |",
        "| MultiAgentVectorEnv, local hosts |",
        "| MultiAgentVectorEnv, ipc 2 hosts |",
        "| multi-agent, 16 envs x 8 agents, MultiAgentVectorEnv, local hosts / SuperSuit "
        "concat_vec_envs_v1, 2 processes |",
    ):
        assert heading in report, heading
    assert ("| SB3 SubprocVecEnv |" in report) == SB3_INSTALLED
    assert ("| PufferLib Multiprocessing, 2 workers x 2 |" in report) == PUFFERLIB_INSTALLED
    assert ("| PufferLib Multiprocessing, 1 worker x 1 |" in report) == PUFFERLIB_INSTALLED
    assert ">= 5 |" not in report and ">= 0.7 |" not in report  # goals no longer set


@QUICK_RUN
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_quick_benchmark_of_envs_that_sleep(quick_run):
    report = quick_run
    for heading in (
        "### 1 ms-step env (sleeps), 4 envs",
        "| Remote ipc 2 hosts, in turn |",
        "| Remote ipc 4 hosts, in turn |",
        "| Remote ipc 1 host, 4 env threads |",
        "| Remote ipc 2 hosts, 2 env threads each |",
        "| Remote embedded default |",
        "| Remote embedded default, in turn |",
        "| Remote embedded default, env_threads=4 |",
        "| raw ZeroMQ floor ipc 4 hosts |",
        "### 1 ms-step env (sleeps), 2 envs per host, 1 and 2 hosts",
    ):
        assert heading in report, heading


@QUICK_RUN
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_quick_benchmark_of_the_defaults_group_and_the_start_up_times(quick_run):
    report = quick_run
    for line in (
        "### defaults, no options: 1 ms-step env (sleeps), 16 envs",
        "### defaults, no options: CartPole-v1, 16 envs",
        "### defaults, no options: env that computes (1 ms of pure-Python work per step), 16 envs",
        "| AsyncVectorEnv, defaults |",
        '| 16 | AsyncVectorEnv, context="forkserver" |',
        "| (context) start-up first in a fresh process, 16 envs (time) |",
        "`make_vec('envserver.bench.envs:bench/Compute-v0', 16, work=",
        "| make_vec, no options |",
        "| SyncVectorEnv |",
        "### start-up: construct + reset + one step + close, CartPole-v1",
        "| 4 | make_vec, no options |",
        "| 16 | AsyncVectorEnv, default context | ",
        "### Targets",
    ):
        assert line in report, line


@pytest.fixture(scope="module")
def own_env_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    """A run on a user's own env, where matplotlib cannot be imported: its stdout and report."""
    broken = tmp_path_factory.mktemp("no-matplotlib") / "matplotlib"
    broken.mkdir()
    (broken / "__init__.py").write_text("raise ImportError('matplotlib is not installed')\n")
    out = tmp_path_factory.mktemp("own") / "own.md"
    path = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    result = run_bench(
        out,
        "--quick",
        "--env",
        "envserver.testing:envserver/DictTuple-v0",  # Tuple actions, Dict observations
        "--env-kwargs",
        '{"max_steps": 5}',
        "--num-envs",
        "3",
        "--hosts",
        "1,2",
        "--transports",
        "tcp",
        "--batch-size",
        "2",
        *ONE_SHORT_ROUND,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(broken.parent), *path])},
    )
    return result.stdout, out


@OWN_ENV_RUN
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_quick_benchmark_of_a_users_own_env(own_env_run):
    _, out = own_env_run
    report = out.read_text()
    for line in (
        '### envserver.testing:envserver/DictTuple-v0 {"max_steps": 5}, 3 envs',
        "| SyncVectorEnv |",
        "| Remote tcp 1 host |",
        "| Remote tcp 2 hosts |",
        "| Remote tcp 2 hosts, first-ready batches of 2 |",
    ):
        assert line in report, line
    for absent in ("### CartPole-v1", "Remote ipc", "raw ZeroMQ floor ipc", "### Soak:", "failed:"):
        assert absent not in report, absent


@OWN_ENV_RUN
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_without_matplotlib_the_report_is_written_and_one_line_says_how_to_get_the_chart(
    own_env_run,
):
    stdout, out = own_env_run
    assert "| Remote tcp 1 host |" in out.read_text()
    assert not out.with_suffix(".png").exists()
    hints = [line for line in stdout.splitlines() if "chart" in line]
    assert hints == [
        "no chart: cannot import matplotlib (matplotlib is not installed); "
        "pip install 'envserver[plot]' adds it"
    ]
    assert stdout.splitlines()[-1] == f"written to {out}"


def test_targets_whose_variants_were_left_out_read_n_a(tmp_path):
    """A run with CartPole's 16 envs on one TCP host only: its targets' other variants are absent.

    The table is built from what ran (the whole runs above read it from real reports).
    """
    ran = [
        variants.Variant(name, lambda: None, rates=[rate, rate * 1.1])
        for name, rate in (("Remote tcp 1 host", 900.0), ("AsyncVectorEnv shm", 450.0))
    ]
    cart = variants.Workload(
        "CartPole-v1, 16 envs", "CartPole-v1", {}, 16, ran, ("AsyncVectorEnv shm",), None
    )
    table = report.targets([cart], {}, soak_growth=0.5)
    floor_row = "CartPole 16 envs, Remote ipc 2 hosts / raw ZeroMQ floor ipc 2 hosts"
    assert f"| {floor_row} | n/a | >= 0.85 | - |" in table
    assert "| (context) CartPole 16 envs, Remote ipc 2 hosts / best AsyncVectorEnv | n/a |" in table
    assert "| client RSS growth over the soak (MB) | 0.50 | flat (< 5 MB) | met |" in table
    assert variants.ratio(cart, "Remote tcp 1 host", "AsyncVectorEnv shm") == 2.0


def test_the_local_round_trip_targets_are_medians_of_per_round_ratios():
    times = {
        floors.LOCAL_SYNC: [10.0, 20.0, 10.0],
        floors.LOCAL_HOST: [40.0, 60.0, 30.0],
        floors.LOCAL_PUFFER: [20.0, 20.0, 20.0],
    }
    target, context = report.local_latency_targets(times)
    puffer = f"one env round trip, {floors.LOCAL_HOST} / {floors.LOCAL_PUFFER}"
    assert target == f"| {puffer} | 2.00 | <= 2 | met |"  # the ratios 2, 3 and 1.5
    assert context.startswith(f"| (context) one env round trip, {floors.LOCAL_HOST} / ")
    assert "| 3.00 | - | - |" in context  # 4, 3 and 3
    del times[floors.LOCAL_PUFFER]  # not installed: n/a, and why
    target, _ = report.local_latency_targets(times)
    assert target.startswith(f"| {puffer} | n/a")
    assert ("pufferlib-core" in target) == (not PUFFERLIB_INSTALLED)


def test_benchmark_refuses_a_bad_option_in_one_line(tmp_path, capsys, monkeypatch):
    """Each refusal is one line and exit status 2, checked in this process (the command's
    main, as the installed command runs it); the first one also as a process of its own."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))  # main adds the working directory
    for option, status, start in (
        # argparse's
        (["--env", "CartPole-v1", "--transports", "udp"], 2, "argument --transports"),
        (["--env", "CartPole-v1", "--hosts", "0"], 2, "argument --hosts"),
        (["--env", "CartPole-v1", "--env-kwargs", "{oops"], 2, "argument --env-kwargs"),
        (["--env", "CartPole-v1", "--env-kwargs", "[1]"], 2, "argument --env-kwargs"),
        # the command's: one line
        (["--env", "CartPole-v1", "--hosts", "5", "--num-envs", "4"], 2, "--hosts"),
        (["--env-kwargs", '{"a": 1}'], 2, "--env-kwargs"),  # without --env
        (["--env", "CartPole-v1", "--num-envs", "4", "--batch-size", "5"], 2, "--batch-size"),
        (["--only", "jittery", "--skip", "Jittery"], 2, "--only and --skip select nothing; "),
        # an env that cannot be made as given: what it says, with its type
        (["--env", "CartPole-v1", "--env-kwargs", '{"no_such_kwarg": 1}'], 2, "--env: cannot"),
        (["--env", "NoSuchEnv-v0"], 2, "--env: cannot make NoSuchEnv-v0: NameNotFound: "),
    ):
        try:
            code = main(["bench", "--quick", *option])
        except SystemExit as exc:  # argparse's refusals
            code = exc.code
        stderr = capsys.readouterr().err
        assert code == status, (option, stderr)
        assert "Traceback" not in stderr, option
        (line,) = stderr.splitlines()
        assert line.startswith(f"envserver bench: {start}"), (option, line)
    result = subprocess.run(
        [*BENCH, "--quick", "--env", "CartPole-v1", "--transports", "udp"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert result.returncode == 2 and len(result.stderr.splitlines()) == 1, result.stderr
    assert list(tmp_path.iterdir()) == []  # no report of a run that did not start


def test_a_variant_that_cannot_be_built_is_reported_and_the_others_still_run(tmp_path):

    def broken():
        raise RuntimeError("this env needs pickle")

    workload = variants.Workload(
        "CartPole-v1, 2 envs",
        "CartPole-v1",
        {},
        2,
        [
            variants.Variant(
                "SyncVectorEnv",
                lambda: gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1")] * 2),
            ),
            variants.Variant("broken", broken),
        ],
        ("SyncVectorEnv",),
        variants.Hosts(tmp_path),
    )
    variants.run_workload(workload, rounds=2, seconds=0.05)
    table = variants.workload_table(workload)
    assert "| broken | failed: RuntimeError: this env needs pickle | - | - |" in table
    assert len(workload.variants[0].rates) == 2
    assert variants.ratio(workload, "SyncVectorEnv", "SyncVectorEnv") == 1.0
    assert variants.ratio(workload, "broken", "SyncVectorEnv") is None
    assert variants.ratio(workload, "SyncVectorEnv", "broken") is None


def test_the_benchmark_imports_only_public_names_of_the_project():
    modules = sorted(
        [*(ROOT / "envserver" / "bench").glob("*.py"), *(ROOT / "benchmarks").glob("*.py")]
    )
    assert Path(run.__file__) in modules and Path(chart.__file__) in modules
    checked = 0
    for module in modules:
        tree = ast.parse(module.read_text())
        imports = [
            node
            for node in ast.walk(tree)
            if isinstance(node, (ast.Import, ast.ImportFrom))
            and any(
                name.split(".")[0] in ("client", "envserver")
                for name in (
                    [node.module or ""]
                    if isinstance(node, ast.ImportFrom)
                    else [alias.name for alias in node.names]
                )
            )
        ]
        checked += len(imports)
        for node in imports:
            names = [alias.name for alias in node.names]
            module_name = (node.module or "") if isinstance(node, ast.ImportFrom) else ""
            parts = [*module_name.split("."), *(p for n in names for p in n.split("."))]
            assert not any(part.startswith("_") for part in parts), (module, ast.unparse(node))
    assert checked >= len(modules) - 1  # the check above looked at something


def test_the_slow_env_floor_runs_the_same_envs_as_the_others(tmp_path):
    floor = floors.RawFloor(workloads.SLOW_ID, 3, 2, tmp_path, workloads.SLOW_KWARGS)
    oracle = gym.vector.SyncVectorEnv(
        [lambda: gym.make(workloads.SLOW_ID, **workloads.SLOW_KWARGS)] * 3,
        autoreset_mode=gym.vector.AutoresetMode.SAME_STEP,
    )
    try:
        np.testing.assert_array_equal(floor.reset(seed=4)[0], oracle.reset(seed=4)[0])
        for _ in range(5):
            actions = np.array([0, 1, 1])
            got, want = floor.step(actions), oracle.step(actions)
            for a, b in zip(got[:4], want[:4]):
                np.testing.assert_array_equal(a, b)
    finally:
        floor.close()
        oracle.close()


def test_only_selects_a_section_by_any_of_its_terms():
    terms = run._terms("defaults, Start-up")
    assert terms == ("defaults", "startup")
    assert run.selected(terms, startup.STARTUP_TITLE)
    assert run.selected(terms, "defaults, no options: CartPole-v1, 16 envs")
    assert not run.selected(terms, "CartPole-v1, 16 envs")
    assert run.selected(run._terms("CartPole"), "CartPole-v1, 4 envs")  # as before: one text
    assert run.selected(None, "anything")
    assert not run.selected(None, "defaults, no options: CartPole-v1, 16 envs", ("defaults",))
    assert run.selected(terms, "start-up: x", run._terms("CartPole"))
    with pytest.raises(Exception, match="no titles"):
        run._terms(" , ")


def test_the_start_up_table_shows_medians_ratios_and_failures():
    make_vec, reference, forkserver = startup.startup_variants()
    assert reference.name == startup.STARTUP_REFERENCE
    make_vec.warm, reference.warm, forkserver.warm = [3.0, 1.0, 8.0], [1.0, 1.0, 2.0], [2.0] * 3
    make_vec.fresh, reference.fresh = [4.0, 6.0], [2.0, 2.0]
    forkserver.errors["fresh"] = "RuntimeError: fresh process: boom"
    table = startup.startup_table({4: [make_vec, reference, forkserver]}, rounds=3)
    assert "| 4 | make_vec, no options | 3.000 | 3.00x | 5.000 | 2.50x |" in table
    assert "| 4 | AsyncVectorEnv, default context | 1.000 | 1.00x | 2.000 | 1.00x |" in table
    assert (
        '| 4 | AsyncVectorEnv, context="forkserver" | 2.000 | 2.00x | '
        "failed: RuntimeError: fresh process: boom | - |"
    ) in table


def test_a_start_up_variant_runs_the_same_code_in_this_process_and_in_a_fresh_one(tmp_path):
    variants = startup.startup_variants()[1:2]  # AsyncVectorEnv, default context: the quickest
    startup._measure(variants, 2, 1, tmp_path)
    assert variants[0].errors == {}
    assert len(variants[0].warm) == 1 and len(variants[0].fresh) == 1
    script = next(tmp_path.glob("startup_*.py")).read_text()
    assert variants[0].construct in script


def test_the_computing_env_is_made_by_hosts_from_its_module_prefix():
    assert envs.calibrate_work(0.0005, trials=2) >= 1
    client = importlib.import_module("envserver.client")
    remote = client.make_vec(envs.COMPUTE_ID, 3, work=10)  # local hosts import it
    oracle = gym.make_vec(envs.COMPUTE_ID, 3, vectorization_mode="sync", work=10)
    try:
        np.testing.assert_array_equal(remote.reset(seed=3)[0], oracle.reset(seed=3)[0])
        actions = np.array([0, 1, 1])
        got, want = remote.step(actions), oracle.step(actions)
        for a, b in zip(got[:4], want[:4]):
            np.testing.assert_array_equal(a, b)
    finally:
        remote.close()
        oracle.close()


def test_the_chart_draws_a_bar_per_variant_and_tells_envservers_from_the_references(tmp_path):
    workload = variants.Workload(
        "CartPole-v1, 2 envs",
        "CartPole-v1",
        {},
        2,
        [
            variants.Variant("SyncVectorEnv", dict, rates=[300.0, 100.0, 200.0]),
            variants.Variant("Remote ipc 1 host", dict, rates=[50.0]),
            variants.Variant("make_vec, no options", dict, rates=[70.0, 90.0]),
            variants.Variant("raw ZeroMQ floor ipc 1 host", dict, rates=[80.0]),
            variants.Variant("broken", dict, error="RuntimeError: this env needs pickle"),
        ],
        ("SyncVectorEnv",),
        variants.Hosts(tmp_path),
    )
    assert chart.bars_of(workload) == [
        chart.Bar("SyncVectorEnv", 200.0, envserver=False),
        chart.Bar("Remote ipc 1 host", 50.0, envserver=True),
        chart.Bar("make_vec, no options", 80.0, envserver=True),
        chart.Bar("raw ZeroMQ floor ipc 1 host", 80.0, envserver=False),
        chart.Bar("broken", None, envserver=False),
    ]
    png = tmp_path / "charts" / "report.png"
    chart.write_chart([workload, workload], png, "envserver benchmark, test")
    assert png.read_bytes().startswith(PNG_MAGIC)
    with pytest.raises(ValueError, match="no workloads"):
        chart.write_chart([], png, "nothing")


def test_drawing_the_chart_leaves_the_processs_matplotlib_state_alone(tmp_path):
    code = (
        "import sys\n"
        "from pathlib import Path\n"
        "from envserver.bench import chart, variants\n"
        "assert 'matplotlib' not in sys.modules  # imported only to draw\n"
        "v = variants.Variant('SyncVectorEnv', dict, rates=[1.0])\n"
        "w = variants.Workload('w', 'CartPole-v1', {}, 1, [v], ('SyncVectorEnv',), None)\n"
        f"chart.write_chart([w], Path({str(tmp_path / 'c.png')!r}), 't')\n"
        "print('matplotlib.pyplot' in sys.modules)\n"
        "import matplotlib\n"
        "print(matplotlib.get_backend())\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "MPLBACKEND": "svg"},  # a user's choice, which must stay theirs
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["False", "svg"]
    assert (tmp_path / "c.png").read_bytes().startswith(PNG_MAGIC)


@pytest.mark.slow
@pytest.mark.timeout(600)  # a wheel, a venv and a benchmark run on a loaded 2-core box
def test_the_installed_command_writes_the_report_and_its_chart_in_the_working_directory(
    tmp_path,
):
    fresh = venv_with_wheel(tmp_path / "venv", build_wheel(tmp_path))
    where = subprocess.run(
        [str(fresh / "python"), "-c", "import envserver.bench.run as m; print(m.__file__)"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert where.returncode == 0, where.stderr
    assert Path(where.stdout.strip()).is_relative_to(tmp_path / "venv"), where.stdout  # the wheel's
    work = tmp_path / "work"  # outside the checkout: nothing of it on the path
    work.mkdir()
    result = subprocess.run(
        [str(fresh / "envserver"), "--log-level", "WARNING", "bench", *SHORT_OWN_ENV],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=work,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    (report,) = work.glob("envserver-bench-*.md")
    assert (
        report.name.removeprefix("envserver-bench-").removesuffix(".md").replace("-", "").isdigit()
    )
    assert f"written to {report}" in result.stdout.splitlines()
    assert f"chart written to {report.with_suffix('.png')}" in result.stdout.splitlines()
    assert sorted(p.name for p in work.iterdir()) == [report.name, report.stem + ".png"]
    assert report.with_suffix(".png").read_bytes().startswith(PNG_MAGIC)
    text = report.read_text()
    assert f'### {envs.COMPUTE_ID} {{"work": 100}}, 2 envs' in text  # made by the wheel's hosts
    assert "| Remote ipc 1 host |" in text and "failed:" not in text


#: The extras' modules, made unavailable in a benchmark's process (as if not installed).
EXTRAS_MODULES = (
    "prometheus_client",
    "stable_baselines3",
    "pufferlib",
    "mpe2",
    "supersuit",
    "ale_py",
)
WITHOUT_EXTRAS = (
    "import sys\n"
    f"sys.modules.update(dict.fromkeys({EXTRAS_MODULES!r}, None))\n"
    "from envserver.cli.app import main\n"
    "sys.exit(main(sys.argv[1:]))\n"
)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_without_the_extras_each_skipped_part_says_which_extra_it_needs(tmp_path):
    """The metrics variant, SB3's and PufferLib's peers and the multi-agent section are skipped,
    each with the extra that installs what it needs; nothing fails, and the targets they feed say
    why."""
    out = tmp_path / "report.md"
    result = subprocess.run(
        [sys.executable, "-c", WITHOUT_EXTRAS, "bench", "--quick", "--out", str(out), *SHORT,
         "--only", "cartpole,multi-agent", "--skip", "defaults,start-up"],
        capture_output=True, text=True, timeout=480, cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    report = out.read_text()
    assert "failed:" not in report and "failed:" not in result.stderr
    for line in (
        "### CartPole-v1, 4 envs",
        "| Remote ipc 1 host |",
        "Skipped: SB3 SubprocVecEnv (needs stable-baselines3: pip install 'envserver[sb3]'); "
        "PufferLib Multiprocessing, 1 worker x 4 (needs pufferlib-core: pip install "
        "'envserver[puffer]'); PufferLib Multiprocessing, 2 workers x 2 (needs pufferlib-core: "
        "pip install 'envserver[puffer]'); Remote ipc 1 host, metrics on (needs "
        "prometheus-client: pip install 'envserver[metrics]').",
        "### multi-agent: MPE simple_spread, 8 agents (agent-steps), 16 envs\n\nSkipped: needs "
        "mpe2 and supersuit: pip install 'envserver[bench]'.",
        "| multi-agent, 16 envs x 8 agents, MultiAgentVectorEnv, local hosts / SuperSuit "
        "concat_vec_envs_v1, 2 processes | n/a (needs mpe2 and supersuit: pip install "
        "'envserver[bench]') | >= 1.0 | - |",
    ):
        assert line in report, line
    for absent in (
        "| SB3 SubprocVecEnv |",
        "| PufferLib Multiprocessing, 1 worker x 4 |",
        "| Remote ipc 1 host, metrics on |",
    ):
        assert absent not in report, absent


def test_without_ale_py_the_pong_workload_says_which_extra_it_needs(tmp_path, monkeypatch):
    """A full run's Pong workload (none in --quick) is skipped with its line, and not run."""
    monkeypatch.setitem(sys.modules, "ale_py", None)  # as if not installed
    plan = workloads.Plan(sizes=[4], host_counts=[1])
    (pong,) = [w for w in workloads.workloads_of(tmp_path, plan) if "Pong" in w.title]
    assert pong.variants == [] and pong.hosts.started == []
    variants.run_workload(pong, rounds=1, seconds=0.01)  # nothing to run: no env made
    assert variants.workload_table(pong) == (
        "### Atari Pong (ale-py), 210x160x3, 4 envs\n\n"
        "Skipped: needs ale-py: pip install 'envserver[bench]'.\n"
    )


PUFFER_NAMES = [
    "PufferLib Multiprocessing, 1 worker x 16",
    "PufferLib Multiprocessing, 2 workers x 8",
]


def test_without_pufferlib_its_peers_are_skipped_on_cartpole_and_pixels_with_the_extra(
    tmp_path, monkeypatch
):
    """PufferLib's two layouts are listed under CartPole and the pixel env, never built."""
    monkeypatch.setitem(sys.modules, "pufferlib", None)  # as if not installed
    plan = workloads.Plan(sizes=[16], host_counts=[1])
    why = "needs pufferlib-core: pip install 'envserver[puffer]'"
    by_title = {w.title: w for w in workloads.workloads_of(tmp_path, plan)}
    for title in ("CartPole-v1, 16 envs", "synthetic pixels 84x84x4, 100 us steps, 16 envs"):
        workload = by_title[title]
        skipped = [v for v in workload.skipped_variants if v.name.startswith("PufferLib")]
        assert [(v.name, v.skipped) for v in skipped] == [(name, why) for name in PUFFER_NAMES]
        assert not any(v.name.startswith("PufferLib") for v in workload.variants)
        alone = variants.Workload(title, workload.env_id, {}, 16, skipped, (), workload.hosts)
        line = "; ".join(f"{name} ({why})" for name in PUFFER_NAMES)
        assert variants.workload_table(alone).endswith(f"\nSkipped: {line}.\n")  # the report's
    others = [w for t, w in by_title.items() if "CartPole-v1, 16" not in t and "pixels" not in t]
    for workload in others:  # the peer of these two workloads only
        names = [v.name for v in workload.variants + workload.skipped_variants]
        assert not any(name.startswith("PufferLib") for name in names), workload.title


def test_an_odd_env_count_has_only_pufferlibs_one_worker_layout():
    names = [v.name for v in variants.puffer_variants("CartPole-v1", {}, 5)]
    assert names == ["PufferLib Multiprocessing, 1 worker x 5"]


@pytest.mark.skipif(not PUFFERLIB_INSTALLED, reason="pufferlib is not installed")
@pytest.mark.timeout(300)
def test_pufferlibs_peers_step_the_same_actions_and_stop_their_workers(tmp_path, capfd):
    """Both layouts run beside SyncVectorEnv on 4 CartPole envs; closing reaps their workers.

    Under the benchmark's signal handlers, as in a run: PufferLib's SIGTERM stops each worker
    quietly (a worker with the handler would print Interrupted's traceback).
    """
    fns = [lambda: gym.make("CartPole-v1")] * 4
    peers = variants.puffer_variants("CartPole-v1", {}, 4)
    workload = variants.Workload(
        "CartPole-v1, 4 envs",
        "CartPole-v1",
        {},
        4,
        [variants.Variant("SyncVectorEnv", lambda: gym.vector.SyncVectorEnv(fns)), *peers],
        ("SyncVectorEnv",),
        variants.Hosts(tmp_path),
    )
    built = []
    for peer in peers:  # keep each env to look at its workers after the run closed it
        peer.make = lambda make=peer.make: built.append(make()) or built[-1]
    with signals_interrupt():
        variants.run_workload(workload, rounds=2, seconds=0.05)
    assert [v.error for v in workload.variants] == [None, None, None]
    assert all(len(v.rates) == 2 and min(v.rates) > 0 for v in workload.variants)
    assert [len(env.env.processes) for env in built] == [1, 2]
    assert all(not p.is_alive() for env in built for p in env.env.processes)
    table = variants.workload_table(workload)
    assert "| PufferLib Multiprocessing, 2 workers x 2 |" in table and "failed" not in table
    assert "Traceback" not in capfd.readouterr().err


@QUICK_RUN
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_quick_run_says_what_it_leaves_out(quick_run):
    """The pixel and Pong workloads are not in --quick: the report says so, once, up front."""
    assert quick_run.count(run.QUICK_NOTE) == 1
    assert quick_run.index(run.QUICK_NOTE) < quick_run.index("### CartPole-v1, 4 envs")
    assert "### synthetic pixels" not in quick_run and "### Atari Pong" not in quick_run
