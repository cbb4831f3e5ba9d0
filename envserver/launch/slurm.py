"""The nodes of a Slurm job: where ``slurm://NODES:PORT`` specs find their hosts.

In a Slurm job, hosts start as a job step, ``envserver serve`` on every node (see
``deploy/slurm/``), and the trainer finds them from the job's node list, which Slurm gives the
batch script in its environment: ``SLURM_JOB_NODELIST`` for the whole job, and
``SLURM_JOB_NODELIST_HET_GROUP_N`` for group N of a heterogeneous job (the trainer on a GPU node
in group 0, the hosts on CPU nodes in group 1). The list comes compressed (``node[01-04,07]``);
Slurm's own ``scontrol show hostnames`` expands it, so every form Slurm writes is read as Slurm
reads it.
"""

from __future__ import annotations

import functools
import os
import re
import subprocess
from collections.abc import Callable, Mapping

from envserver.wire.endpoints import HostSpec

__all__ = [
    "JOB_NODES_VARIABLE",
    "JOB_VARIABLE",
    "expand_nodes",
    "foreign_host",
    "job_nodes",
    "rank_hosts",
]

#: The whole job's node list.
JOB_NODES_VARIABLE = "SLURM_JOB_NODELIST"
#: The job's id (each task of a job array has its own); hosts report theirs.
JOB_VARIABLE = "SLURM_JOB_ID"
#: How long ``scontrol`` gets (without its configuration it retries for a minute).
SCONTROL_TIMEOUT_S = 15.0

_GROUP = re.compile(r"het-group-(\d+)")


def job_nodes(
    nodes: str,
    environ: Mapping[str, str] | None = None,
    expand: Callable[[str], list[str]] | None = None,
) -> list[str]:
    """The node names ``nodes`` stands for, in Slurm's order.

    Args:
        nodes: ``job`` (every node of the job this process runs in), ``het-group-N`` (group N
            of a heterogeneous job) or a node list (``node[01-04,07]``).
        environ: Where the job's variables are read (default: this process's environment).
        expand: Expands a node list (default: :func:`expand_nodes`).

    Raises:
        ValueError: Outside a Slurm job (for ``job`` and ``het-group-N``), for a group the job
            does not have, or a node list that does not parse.
    """
    environ = os.environ if environ is None else environ
    group = _GROUP.fullmatch(nodes)
    if nodes == "job" or group:
        names = [JOB_NODES_VARIABLE]
        if group:
            number = group.group(1)
            names = [
                f"SLURM_JOB_NODELIST_HET_GROUP_{number}",
                f"SLURM_JOB_NODELIST_PACK_GROUP_{number}",
            ]
        listed = next((environ[name] for name in names if environ.get(name)), None)
        if listed is None:
            if group is None or not environ.get(JOB_NODES_VARIABLE):
                raise ValueError(
                    f"slurm://{nodes} names the nodes of this Slurm job, but this process runs "
                    f"in none ({names[0]} is not set): run the trainer in the job's batch script "
                    "(sbatch) or in salloc, or name the nodes (slurm://node[01-04]:PORT)"
                )
            prefix = "SLURM_JOB_NODELIST_HET_GROUP_"
            groups = sorted(
                int(k.removeprefix(prefix))
                for k in environ
                if k.startswith(prefix) and k[len(prefix) :].isdigit()
            )
            which = f"its groups: {', '.join(map(str, groups))}" if groups else "none"
            raise ValueError(
                f"slurm://{nodes}: this job has no heterogeneous group {group.group(1)} "
                f"({names[0]} is not set; {which})"
            )
        nodes = listed
    if not nodes or any(c.isspace() for c in nodes):
        raise ValueError(f"{nodes!r} is not a Slurm node list")
    return (expand or expand_nodes)(nodes)


def expand_nodes(nodes: str) -> list[str]:
    """Every node name of a Slurm node list (``node[01-04,07],gpu1``), by ``scontrol``.

    Raises:
        ValueError: If ``scontrol`` is missing or does not read the list.
    """
    try:
        done = subprocess.run(
            ["scontrol", "show", "hostnames", nodes],
            capture_output=True,
            text=True,
            timeout=SCONTROL_TIMEOUT_S,
            check=False,
        )
    except FileNotFoundError:
        raise ValueError(
            f"slurm:// specs expand node lists with Slurm's scontrol, which is not on PATH "
            f"here (node list {nodes!r})"
        ) from None
    except subprocess.TimeoutExpired:
        raise ValueError(
            f"scontrol did not expand the node list {nodes!r} within {SCONTROL_TIMEOUT_S:g} s "
            "(is Slurm's configuration readable here?)"
        ) from None
    names = done.stdout.split()
    if done.returncode != 0 or not names:
        said = [line for line in done.stderr.splitlines() if line.strip()]
        why = said[-1].removeprefix("scontrol: ") if said else f"exit status {done.returncode}"
        raise ValueError(f"the Slurm node list {nodes!r} does not parse: {why}")
    return names


def foreign_host(
    endpoint: str,
    host_job: str,
    environ: Mapping[str, str] | None = None,
    expand: Callable[[str], list[str]] | None = None,
) -> str | None:
    """Why a host of a ``slurm://`` spec is not this job's, or None where it may be used.

    On a node of this process's job, a host must be of the same job: another job's (a task of
    the same job array, a job sharing the node) answers on the same port when this job's host
    could not bind it. A host on a node of another job was named on purpose.

    Args:
        endpoint: The host's endpoint, ``tcp://NODE:PORT``.
        host_job: The job it says it runs in (empty: none).
        environ: Where this job's variables are read (default: this process's environment).
        expand: Expands a node list (default: :func:`expand_nodes`, once per list).
    """
    environ = os.environ if environ is None else environ
    job = environ.get(JOB_VARIABLE)
    if not job or host_job == job or not environ.get(JOB_NODES_VARIABLE):
        return None
    node = endpoint.removeprefix("tcp://").rpartition(":")[0]
    if node not in job_nodes("job", environ, expand or _expand_once):
        return None
    theirs = f"Slurm job {host_job}" if host_job else "no Slurm job"
    return (
        f"serves {theirs}, not this one ({job}): another job's host on this job's node (a "
        "task of the same array, or a job sharing the node; each job's hosts need their own "
        "ports, ENVSERVER_PORT), or this job's could not start there"
    )


def rank_hosts(spec: str, rank: int, ranks: int) -> str:
    """The share of a ``slurm://`` spec's hosts that one rank of a multi-rank trainer uses.

    Each rank (a DDP process with a vector env of its own) takes the same slice of every
    node's ports: with ``slurm://NODES:20600-20607`` and 2 ranks, rank 0 takes ports
    20600-20603 of every node and rank 1 ports 20604-20607, so no two ranks share a host and
    a lost node costs each the same.

    Args:
        spec: A ``slurm://NODES:FIRST-LAST`` spec (the scripts' ``ENVSERVER_HOSTS``).
        rank: This rank, from 0.
        ranks: How many ranks share the spec's hosts.

    Returns:
        The rank's ``slurm://`` spec, checked for its job's hosts as the whole one is.

    Raises:
        ValueError: If ``spec`` is not a ``slurm://`` spec, or its ports do not split evenly
            into ``ranks`` slices.
    """
    parsed = HostSpec.parse(spec)
    if parsed.scheme != "slurm":
        raise ValueError(f"{spec!r} is not a slurm:// spec")
    if not (isinstance(ranks, int) and ranks >= 1 and isinstance(rank, int) and 0 <= rank < ranks):
        raise ValueError(f"rank {rank!r} of {ranks!r} ranks: expected 0 <= rank < ranks")
    ports = parsed.ports
    if len(ports) % ranks:
        raise ValueError(
            f"{spec!r}: {len(ports)} port(s) per node do not split into {ranks} equal slices "
            "(ENVSERVER_HOSTS_PER_NODE: a multiple of the ranks)"
        )
    mine = ports[rank * len(ports) // ranks : (rank + 1) * len(ports) // ranks]
    last = f"-{mine[-1]}" if len(mine) > 1 else ""
    return f"slurm://{parsed.name}:{mine[0]}{last}"


_expand_once = functools.lru_cache(maxsize=8)(expand_nodes)
