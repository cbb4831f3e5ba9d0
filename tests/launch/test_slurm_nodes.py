"""slurm:// specs outside a Slurm job and with a job's variables: which node list is read, and
the one clear line a trainer, `envserver rollout` and `envserver ping` give where there is none.

Expanding real node lists with scontrol, and hosts found on a real Slurm cluster, are in
tests/cluster/test_slurm.py (which needs `.ci/provision-slurm`).
"""

from __future__ import annotations

import os
import re

import pytest
from helpers import run_envserver
from ports import free_ports

from envserver import client
from envserver.errors import HostUnavailableError
from envserver.launch import slurm, specs
from envserver.launch.slurm import foreign_host, job_nodes, rank_hosts
from envserver.testing import start_host

NO_JOB = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "ENVSERVER_"))}
HET_JOB = {
    "SLURM_JOB_NODELIST": "gpu1,cpu[1-2]",
    "SLURM_JOB_NODELIST_HET_GROUP_0": "gpu1",
    "SLURM_JOB_NODELIST_HET_GROUP_1": "cpu[1-2]",
}


def the_list(nodes: str) -> list[str]:
    """Stands in for scontrol: which list would be expanded."""
    return [nodes]


def test_the_job_and_its_groups_name_their_own_node_lists():
    assert job_nodes("job", HET_JOB, the_list) == ["gpu1,cpu[1-2]"]
    assert job_nodes("het-group-0", HET_JOB, the_list) == ["gpu1"]
    assert job_nodes("het-group-1", HET_JOB, the_list) == ["cpu[1-2]"]
    assert job_nodes("cpu[7-8]", {}, the_list) == ["cpu[7-8]"]  # a list needs no job
    # srun's own heterogeneous steps (srun -N1 : -N2) set only the older names
    packed = {"SLURM_JOB_NODELIST": "a,b", "SLURM_JOB_NODELIST_PACK_GROUP_1": "b"}
    assert job_nodes("het-group-1", packed, the_list) == ["b"]


@pytest.mark.parametrize(
    ("nodes", "environ", "why"),
    [
        ("job", {}, "slurm://job names the nodes of this Slurm job, but this process runs in none"),
        ("het-group-1", {}, "(SLURM_JOB_NODELIST_HET_GROUP_1 is not set)"),
        (
            "het-group-2",
            HET_JOB,
            "group 2 (SLURM_JOB_NODELIST_HET_GROUP_2 is not set; its groups: 0, 1)",
        ),
        ("het-group-1", {"SLURM_JOB_NODELIST": "a"}, "HET_GROUP_1 is not set; none)"),
        ("node 1", {}, "'node 1' is not a Slurm node list"),
    ],
)
def test_nodes_that_cannot_be_named_here_say_why(nodes, environ, why):
    with pytest.raises(ValueError, match=re.escape(why)):
        job_nodes(nodes, environ, the_list)


def test_a_trainer_outside_a_job_is_told_at_once(monkeypatch):
    for name in list(os.environ):
        if name.startswith("SLURM_"):
            monkeypatch.delenv(name)
    with pytest.raises(ValueError, match="this process runs in none"):
        client.make_vec("CartPole-v1", num_envs=2, hosts="slurm://job:5555")


@pytest.mark.parametrize("command", ["rollout", "ping"])
def test_the_commands_say_it_in_one_line(command):
    args = ["CartPole-v1", "--hosts", "slurm://het-group-1:5555"] if command == "rollout" else []
    result = run_envserver(
        command, *args, env={**NO_JOB, "ENVSERVER_HOSTS": "slurm://het-group-1:5555"}
    )
    lines = result.stderr.strip().splitlines()
    assert result.returncode == (2 if command == "rollout" else 1), result.stderr
    assert len(lines) == 1, result.stderr
    assert "SLURM_JOB_NODELIST_HET_GROUP_1 is not set" in lines[0]
    assert "Traceback" not in result.stderr


ARRAY_TASK = {"SLURM_JOB_ID": "12", "SLURM_JOB_NODELIST": "node[1-2]"}


def the_nodes(nodes: str) -> list[str]:
    """Stands in for scontrol: node[1-2] only."""
    assert nodes == "node[1-2]"
    return ["node1", "node2"]


@pytest.mark.parametrize(
    ("endpoint", "host_job", "environ", "why"),
    [
        ("tcp://node2:20600", "12", ARRAY_TASK, None),  # this job's
        ("tcp://node2:20600", "13", ARRAY_TASK, "serves Slurm job 13, not this one (12)"),
        ("tcp://node1:5555", "", ARRAY_TASK, "serves no Slurm job, not this one (12)"),
        ("tcp://node7:5555", "13", ARRAY_TASK, None),  # another job's node: named on purpose
        ("tcp://node2:5555", "13", {}, None),  # a trainer outside a job takes any
    ],
)
def test_a_host_of_another_job_on_this_jobs_nodes_is_refused(endpoint, host_job, environ, why):
    refused = foreign_host(endpoint, host_job, environ, the_nodes)
    assert refused == why if why is None else why in refused


def test_each_rank_takes_its_own_slice_of_every_nodes_ports():
    spec = "slurm://node[2-3]:20600-20607"
    assert [rank_hosts(spec, rank, 2) for rank in (0, 1)] == [
        "slurm://node[2-3]:20600-20603",
        "slurm://node[2-3]:20604-20607",
    ]
    assert rank_hosts(spec, 7, 8) == "slurm://node[2-3]:20607"
    assert rank_hosts("slurm://job:5555", 0, 1) == "slurm://job:5555"


@pytest.mark.parametrize(
    ("spec", "rank", "ranks", "why"),
    [
        ("slurm://job:5555-5557", 0, 2, "3 port(s) per node do not split into 2 equal slices"),
        ("dns://hosts:5555", 0, 1, "is not a slurm:// spec"),
        ("slurm://job:5555-5556", 2, 2, "rank 2 of 2 ranks: expected 0 <= rank < ranks"),
    ],
)
def test_a_share_that_cannot_be_given_says_why(spec, rank, ranks, why):
    with pytest.raises(ValueError, match=re.escape(why)):
        rank_hosts(spec, rank, ranks)


@pytest.mark.parametrize("host_job", ["12", "13"])
def test_a_trainer_in_a_job_takes_a_slurm_spec_host_of_its_own_job_only(
    tmp_path, monkeypatch, host_job
):
    """A real host that says it runs in job 13 (or 12), on a node of the trainer's job 12."""
    port = free_ports()
    prefix = ["env", f"SLURM_JOB_ID={host_job}"]
    host = start_host(tmp_path, bind=f"tcp://127.0.0.1:{port}", prefix=prefix)
    try:
        monkeypatch.setenv("SLURM_JOB_ID", "12")
        monkeypatch.setenv("SLURM_JOB_NODELIST", "localhost")
        monkeypatch.setattr(specs, "_expand", the_list)  # no scontrol needed
        monkeypatch.setattr(slurm, "_expand_once", the_list)
        options = {"connect_timeout_s": 3.0}
        make = lambda: client.make_vec(  # noqa: E731
            "CartPole-v1", 2, hosts=f"slurm://job:{port}", vector_kwargs=options
        )
        if host_job == "12":
            envs = make()
            assert list(envs.hosts) == [f"tcp://localhost:{port}"]
            envs.close()
        else:
            why = f"tcp://localhost:{port} (serves Slurm job 13, not this one (12)"
            with pytest.raises(HostUnavailableError, match=re.escape(why)):
                make()
    finally:
        host.stop()
