"""Slurm for real: deploy/slurm/'s sbatch scripts on a Slurm cluster of three nodes.

Needs the cluster ``.ci/provision-slurm`` starts on this machine (munged, slurmctld, and a
slurmd per node, each node a network namespace with its own address and hostname); run with
``make test-slurm``. Jobs are submitted with ``sbatch --wait``, the trainer
(tests/cluster/slurm_trainer.py) runs in the job against hosts the script started (or those of a
host job beside it), and the tests check what it wrote, that nothing of ours runs after the job,
and that the cluster is whole again.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest
from helpers import keygen, wait_for

from envserver.launch.slurm import expand_nodes

pytestmark = pytest.mark.slurm

ROOT = Path(__file__).resolve().parents[2]
PROVISION = ROOT / ".ci" / "provision-slurm"
NODES = ["node1", "node2", "node3"]
JOB_TIMEOUT_S = 600


def run(*args: str, timeout: float = 60) -> str:
    done = subprocess.run(args, capture_output=True, text=True, timeout=timeout, check=False)
    assert done.returncode == 0, f"{args}: {done.stderr}"
    return done.stdout


def idle_nodes() -> list[str]:
    return sorted(run("sinfo", "-h", "-N", "-t", "idle", "-o", "%N").split())


def ours_running() -> list[str]:
    """Every job, and every process on a node but its slurmd (the jobs' steps and hosts)."""
    left = run("squeue", "-h", "-o", "job %i %j %T").splitlines()
    for node in NODES:
        for pid in run("ip", "netns", "pids", f"slurm-{node}").split():
            try:
                command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:  # gone meanwhile
                continue
            if "slurmd" not in command.split(" ", 1)[0]:
                left.append(f"{node}: {pid} {command}")
    return left


@pytest.fixture(scope="module", autouse=True)
def cluster():
    """The three nodes idle before the tests, and nothing of ours left after each."""
    if subprocess.run(["scontrol", "ping"], capture_output=True).returncode != 0:
        pytest.fail("no Slurm cluster: run `bash .ci/provision-slurm` first (make test-slurm)")
    wait_for(lambda: idle_nodes() == NODES, "three idle nodes", 60)
    yield


class Job:
    """A job ``sbatch --wait`` submitted: its id at once, its exit and output once it ends.

    Args:
        script: The sbatch script of deploy/slurm/.
        workdir: The job's working directory; its output goes to ``NAME.out`` there.
        command: The command the script runs.
        options: sbatch options (before the script: they override its ``#SBATCH`` lines).
        name: Names the output file.
        env: Variables of the job's environment (the test's ``ENVSERVER_*`` and ``SLURM_*``
            are not passed on).
    """

    def __init__(
        self,
        script: str,
        workdir: Path,
        *command: str,
        options: Sequence[str] = (),
        name: str = "job",
        **env: str,
    ) -> None:
        environ = {
            **{k: v for k, v in os.environ.items() if not k.startswith(("ENVSERVER_", "SLURM_"))},
            "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
            "PYTHONPATH": f"{ROOT / 'tests' / 'harness'}:{ROOT / 'tests' / 'cluster'}",
            **env,
        }
        self.output = workdir / f"{name}.out"
        self.process = subprocess.Popen(
            [
                "sbatch",
                "--wait",
                "--parsable",
                f"--chdir={workdir}",
                f"--output={self.output}",
                *options,
                str(ROOT / "deploy" / "slurm" / script),
                *command,
            ],
            env=environ,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.id = self.process.stdout.readline().strip().split(";")[0]  # printed once submitted
        if not self.id:
            raise AssertionError(f"sbatch {script} failed: {self.process.communicate()[1]}")

    def state(self) -> str:
        """RUNNING, PENDING ... while in the queue; empty once it ended."""
        return run("squeue", "-h", "-j", self.id, "-o", "%T").strip()

    def result(self) -> tuple[int, str]:
        """Waits for the job to end (cancelled after ``JOB_TIMEOUT_S``); its exit and output."""
        try:
            _, stderr = self.process.communicate(timeout=JOB_TIMEOUT_S)
        finally:
            if self.process.poll() is None:
                subprocess.run(["scancel", self.id], check=False)
                self.process.kill()
        text = self.output.read_text() if self.output.exists() else ""
        return self.process.returncode, text + stderr


def submit(script: str, tmp_path: Path, *command: str, **env: str) -> tuple[int, str]:
    """``sbatch --wait`` of deploy/slurm/SCRIPT running ``command``; its exit and its output."""
    return Job(script, tmp_path, *command, **env).result()


def nothing_left() -> None:
    try:
        wait_for(lambda: not ours_running(), "nothing of ours left on the cluster", 60)
    except AssertionError:
        raise AssertionError(f"left on the cluster: {ours_running()}") from None


def test_node_lists_expand_as_slurm_reads_them():
    assert expand_nodes("node[1-3],gpu[01-02,05]") == [
        "node1",
        "node2",
        "node3",
        "gpu01",
        "gpu02",
        "gpu05",
    ]
    with pytest.raises(ValueError, match=r"'node\[1-3\]x' does not parse: Invalid hostlist"):
        expand_nodes("node[1-3]x")


def test_a_heterogeneous_job_serves_exactly_what_sync_vector_env_gives(tmp_path):
    out, keys = tmp_path / "report.json", tmp_path / "keys"  # keys on the shared filesystem
    keygen(keys, "server")
    keygen(keys / "trainers", "trainer")
    trainer = [sys.executable, str(ROOT / "tests" / "cluster" / "slurm_trainer.py")]
    status, output = submit(
        "envserver-het.sbatch", tmp_path, *trainer, "oracle", str(out), ENVSERVER_KEYS=str(keys)
    )
    assert status == 0, output
    report = json.loads(out.read_text())
    assert report["mismatches"] == [] and report["steps"] == 301
    assert report["keyless_answered"] is False  # CURVE: the keys of ENVSERVER_KEYS only
    assert "CURVE is off" not in output
    # group 1 is node2 and node3 (the trainer runs on node1), four hosts each
    nodes = sorted({endpoint.split("//")[1].split(":")[0] for endpoint in report["hosts"]})
    assert nodes == ["node2", "node3"], report
    assert len(report["hosts"]) == 8 and min(report["envs_per_host"]) >= 1
    nothing_left()


def test_a_job_runs_its_trainer_beside_hosts_on_the_other_nodes(tmp_path):
    status, output = submit("envserver.sbatch", tmp_path)  # the script's own short rollout
    assert status == 0, output
    assert "CartPole-v1 x 16 on 8 host(s)" in output, output
    assert "Traceback" not in output
    nothing_left()


def rollout_summary(output: str) -> dict:
    """What ``envserver rollout --json`` printed in a job's output (empty if it printed none)."""
    lines = [line for line in output.splitlines() if line.startswith('{"env_id"')]
    return json.loads(lines[-1]) if lines else {}


ROLLOUT = ["envserver", "rollout", "CartPole-v1", "--num-envs", "4", "--steps", "300", "--json"]


def test_the_tasks_of_a_job_array_on_shared_nodes_each_use_their_own_jobs_hosts(tmp_path):
    """Two tasks of an array on the same two nodes: by default each task's hosts have ports of
    their own; on the same port (ENVSERVER_PORT), one task's host cannot bind, and that task
    fails without a step on the other task's host.

    On the same port, one host per task: with two ports each, the two tasks can each take one
    port of the pair, and then both fail (each task's hosts are one srun step, ended by any of
    them that cannot start)."""
    options = ["--array=0-1", "--nodes=2", "--cpus-per-task=2", "--nodelist=node[1-2]"]
    same = {"ENVSERVER_PORT": "5555", "ENVSERVER_HOSTS_PER_NODE": "1"}
    runs = {}
    for name, env in (("own", {}), ("same", same)):
        status, _ = Job(
            "envserver.sbatch", tmp_path, *ROLLOUT, options=options, name=f"{name}-%a", **env
        ).result()
        outputs = [(tmp_path / f"{name}-{task}.out").read_text() for task in (0, 1)]
        runs[name] = status, outputs, [rollout_summary(output) for output in outputs]
        nothing_left()
    status, outputs, summaries = runs["own"]
    assert status == 0, outputs
    hosts = [{h["endpoint"] for h in summary["hosts"]} for summary in summaries]
    assert len(hosts[0]) == len(hosts[1]) == 2 and not hosts[0] & hosts[1], hosts
    status, outputs, summaries = runs["same"]
    assert status != 0, outputs  # the task whose hosts could not bind failed its job
    ran = [summary.get("env_steps", 0) for summary in summaries]
    assert sorted(ran) == [0, 1200], outputs
    failed = outputs[ran.index(0)]
    assert "cannot bind tcp://*:5555: Address already in use" in failed, failed
    assert "the hosts' step ended (exit 2) before the trainer" in failed, failed


def test_a_trainer_takes_no_host_of_another_job_from_its_own_jobs_nodes(tmp_path):
    """A host job on node1 (ports 5555-5556), and a job sharing node1 whose trainer names its
    own job's hosts on those ports (slurm://job): the other job's hosts answer there, and the
    trainer refuses them, saying whose they are."""
    hosts_job = Job(
        "envserver-hosts.sbatch",
        tmp_path,
        options=["--nodelist=node1", "--cpus-per-task=2"],
        name="hosts",
        ENVSERVER_HOSTS_PER_NODE="2",
    )
    try:
        ping = [sys.executable, "-m", "envserver", "ping", "tcp://node1:5555", "tcp://node1:5556"]
        answering = lambda: subprocess.run(ping, capture_output=True, timeout=60).returncode == 0  # noqa: E731
        wait_for(answering, "the host job's hosts answering", 120)
        script = tmp_path / "trainer.sbatch"
        script.write_text(
            "#!/bin/bash\nexec "
            + " ".join(ROLLOUT)
            + " --hosts slurm://job:5555-5556 --connect-timeout 5\n"
        )
        trainer = Job(
            str(script), tmp_path, options=["--nodelist=node1", "--cpus-per-task=1"], name="trainer"
        )
        status, output = trainer.result()
    finally:
        subprocess.run(["scancel", hosts_job.id], check=False)
        hosts_job.result()
    assert status != 0, output
    assert rollout_summary(output).get("env_steps", 0) == 0, output
    why = f"tcp://node1:5555 (serves Slurm job {hosts_job.id}, not this one ({trainer.id})"
    assert why in output, output
    nothing_left()


RANK_TRAINER = """
import json, os, sys
from pathlib import Path

from envserver import client
from envserver.launch.slurm import rank_hosts

rank, ranks = int(os.environ["SLURM_PROCID"]), int(os.environ["SLURM_NTASKS"])
hosts = rank_hosts(os.environ["ENVSERVER_HOSTS"], rank, ranks)
envs = client.make_vec("CartPole-v1", 4, hosts=hosts)
envs.reset(seed=rank)
for _ in range(200):
    envs.step(envs.action_space.sample())
Path(f"{sys.argv[1]}.{rank}").write_text(json.dumps(list(envs.hosts)))
envs.close()
"""


def test_each_rank_of_a_multi_rank_trainer_uses_its_own_share_of_the_jobs_hosts(tmp_path):
    """Two ranks (srun's tasks on the trainer's node) on the four hosts of the other node: each
    steps its own vector env on two of them (rank_hosts), none shared."""
    script = tmp_path / "ranks.py"
    script.write_text(RANK_TRAINER)
    ranks = ["srun", "--nodes=1", "--ntasks=2", "--relative=0", "--cpus-per-task=1", "--overlap"]
    command = [*ranks, sys.executable, str(script), str(tmp_path / "rank")]
    status, output = Job("envserver.sbatch", tmp_path, *command, options=["--nodes=2"]).result()
    assert status == 0, output
    hosts = [set(json.loads((tmp_path / f"rank.{rank}").read_text())) for rank in (0, 1)]
    assert len(hosts[0]) == len(hosts[1]) == 2 and not hosts[0] & hosts[1], hosts
    nothing_left()


def test_a_job_its_user_cancels_ends_without_an_error_from_its_exit_trap(tmp_path):
    job = Job("envserver.sbatch", tmp_path, "sleep", "300", options=["--nodes=2"])
    try:
        read = lambda: job.output.read_text() if job.output.exists() else ""  # noqa: E731
        wait_for(lambda: read().count("serving on") == 4, "the job's hosts serving", 120)
        run("scancel", job.id)
        job.result()
    finally:
        subprocess.run(["scancel", job.id], check=False)
    nothing_left()  # the batch script's EXIT trap included
    output = read()
    assert "CANCELLED" in output, output
    assert "scancel: error" not in output, output


def test_a_node_lost_mid_rollout_is_recovered_with_every_step_accounted_for(tmp_path):
    out, mark = tmp_path / "report.json", tmp_path / "mark"
    trainer = [sys.executable, str(ROOT / "tests" / "cluster" / "slurm_trainer.py")]
    # A job of one component: Slurm 22.05 ends a heterogeneous job when any of its nodes fails,
    # even with --no-kill (measured: it kills the leader); one component shrinks and goes on.
    args = ("envserver.sbatch", tmp_path, *trainer, "chaos", str(out), str(mark))
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        job = pool.submit(submit, *args, ENVSERVER_IMPORT="chaos_envs")
        try:
            killed = kill_node3_when(mark)
            status, output = job.result(JOB_TIMEOUT_S)
        finally:
            subprocess.run([str(PROVISION)], capture_output=True, timeout=300)  # node3 back
    assert killed
    assert status == 0, output
    report = json.loads(out.read_text())
    assert report["problems"] == [], report["problems"]
    assert report["after_kill"] == 60 and report["host_restarts"] == 4, report
    lost = [i for i, n in enumerate(report["reports"]) if n]
    on_node3 = sum(
        count for h, count in zip(report["hosts_before"], report["envs_per_host"]) if "node3" in h
    )
    assert len(lost) == on_node3 and set(report["reports"]) <= {0, 1}, report
    assert all("node3" not in h for h in report["hosts_after"]), report
    assert report["results"] == 12 * (1 + report["steps"]), report
    nothing_left()
    wait_for(lambda: idle_nodes() == NODES, "node3 back in service", 120)


def kill_node3_when(mark: Path) -> list[str]:
    """Once the trainer is 20 steps in, node3 fails: its slurmd and every process in its
    namespace (its hosts) are killed at once; once Slurm has marked it down, the trainer is
    told. Returns what was killed."""
    wait_for(mark.with_suffix(".ready").exists, "the trainer 20 steps in", 120)
    hosts = json.loads(mark.with_suffix(".ready").read_text())
    assert any("node3" in h for h in hosts), hosts
    pids = run("ip", "netns", "pids", "slurm-node3").split()
    for pid in pids:
        os.kill(int(pid), signal.SIGKILL)
    # Slurm notices later (SlurmdTimeout): a step without --no-kill would end then on every
    # node, the hosts of node2 included. The trainer's last 60 steps come after that.
    wait_for(lambda: "down" in run("sinfo", "-h", "-n", "node3", "-o", "%T"), "node3 down", 120)
    mark.with_suffix(".killed").write_text("")
    return pids


def test_a_host_job_that_slurm_warns_drains_and_its_envs_move_with_their_state(tmp_path):
    """A job of hosts alone (envserver-hosts.sbatch) serves a trainer in another job
    (envserver.sbatch, its own hosts as spares). Slurm warns the host job of its end (the
    script's --signal=TERM@120): each of the four hosts, forked by one `--processes 4`, gets
    Slurm's SIGTERM and its parent's and drains once, the trainer moves the envs of all four,
    with their state, to its spares, and the rollout equals SyncVectorEnv's throughout with no
    env reported lost; the drained hosts exit 0, and their job with them, before its limit."""
    out, mark = tmp_path / "report.json", tmp_path / "mark"
    hosts_job = Job("envserver-hosts.sbatch", tmp_path, options=["--time=10"], name="hosts")
    trainer_job = None
    try:
        wait_for(lambda: hosts_job.state() == "RUNNING", "the host job to run", 60)
        node = run("squeue", "-h", "-j", hosts_job.id, "-o", "%N").strip()
        trainer = [sys.executable, str(ROOT / "tests" / "cluster" / "slurm_trainer.py")]
        trainer += ["drain", str(out), str(mark), f"slurm://{node}:5555-5558"]
        trainer_job = Job("envserver.sbatch", tmp_path, *trainer, options=["--nodes=2"])
        wait_for(mark.with_suffix(".ready").exists, "the trainer 20 steps in", 120)
        warn_now(hosts_job.id)
        status, output = trainer_job.result()
        hosts_status, hosts_output = hosts_job.result()
    finally:
        for job in (hosts_job, trainer_job):
            if job is not None and job.process.poll() is None:
                subprocess.run(["scancel", job.id], check=False)
    assert status == 0, output
    report = json.loads(out.read_text())
    assert report["mismatches"] == [], report
    assert report["envs_moved"] == 12 and report["moved_at"] is not None, report
    assert report["host_failures"] == 0 and report["host_restarts"] == 0, report
    assert set(report["hosts_after"]) <= set(report["spares"]), report
    assert hosts_status == 0, hosts_output  # every host exited 0, before the time limit
    assert hosts_output.count("draining: 1 session(s) holding 3 env(s)") == 4, hosts_output
    assert hosts_output.count("drained: no session left") == 4, hosts_output
    # Warned by Slurm and by their parent (two SIGTERMs close together may arrive as one).
    assert "received SIGTERM; 4 hosts drain, then stop" in hosts_output, hosts_output
    assert "received SIGTERM while draining: the drain goes on" in hosts_output, hosts_output
    nothing_left()


WARNED_TRAINER = """
import json, signal, sys, time
from pathlib import Path

import numpy as np

from envserver import client

out, mark, after_s = Path(sys.argv[1]), Path(sys.argv[2]), float(sys.argv[3])
warned = []
signal.signal(signal.SIGTERM, lambda signum, frame: warned.append(time.monotonic()))
envs = client.make_vec("CartPole-v1", 4, vector_kwargs={"on_host_failure": "restart"})
envs.reset(seed=0)
mark.write_text("")
steps = steps_after = 0
deadline = time.monotonic() + 240
while time.monotonic() < deadline and not (warned and time.monotonic() - warned[0] >= after_s):
    envs.step(np.zeros(4, dtype=np.int64))
    time.sleep(0.02)  # the trainer's own work between steps
    steps += 1
    steps_after += bool(warned)
envs.close()
out.write_text(json.dumps({"warned": bool(warned), "steps": steps, "steps_after": steps_after}))
"""


def test_a_trainer_warned_by_slurm_has_its_hosts_until_the_time_limit(tmp_path):
    """The trainer's own job is warned (--signal=TERM@120, due at once): the trainer gets the
    SIGTERM, and its hosts serve it past ENVSERVER_DRAIN_GRACE, until it ends on its own."""
    out, mark, script = tmp_path / "report.json", tmp_path / "ready", tmp_path / "trainer.py"
    script.write_text(WARNED_TRAINER)
    options = ["--nodes=2", "--time=10", "--signal=TERM@120"]
    trainer = [sys.executable, str(script), str(out), str(mark), "20"]
    job = Job("envserver.sbatch", tmp_path, *trainer, options=options, ENVSERVER_DRAIN_GRACE="10")
    try:
        wait_for(mark.exists, "the trainer stepping", 120)
        warn_now(job.id)
        status, output = job.result()
    finally:
        if job.process.poll() is None:
            subprocess.run(["scancel", job.id], check=False)
    assert status == 0, output
    report = json.loads(out.read_text())
    assert report["warned"] and report["steps_after"] > 0, report
    assert "Slurm warned the job: SIGTERM to the trainer" in output, output
    nothing_left()


def warn_now(job: str) -> None:
    """Makes Slurm send JOB the warning of its --signal=TERM@120 now: its time limit is cut to
    60-120 s from now, and Slurm signals the job's steps at its next look at the limits."""
    days, _, clock = run("squeue", "-h", "-j", job, "-o", "%M").strip().rpartition("-")
    elapsed_s = 0
    for part in clock.split(":"):  # [D-][H:]M:SS
        elapsed_s = elapsed_s * 60 + int(part)
    elapsed_s += int(days or 0) * 86400
    run("scontrol", "update", f"JobId={job}", f"TimeLimit={elapsed_s // 60 + 2}")
