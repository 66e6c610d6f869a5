"""The options of a job of several nodes: as given, from torchrun's PET_ variables, from an
srun step's environment; a bad combination is one clear line. And where a worker stands,
read from torchrun's environment."""

from __future__ import annotations

import argparse

import pytest

from ptdash.nodes import place
from ptdash.tui.errors import CliError
from ptdash.tui.nodeopts import Nodes, add_arguments, expand_nodelist, resolve


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(argv)


def test_torchruns_flags_make_the_static_rendezvous_of_every_node():
    nodes = resolve(_args("--nnodes", "2", "--node-rank", "1", "--rdzv-endpoint", "gpu0:29400", "--rdzv-id", "j7"), {})
    assert nodes == Nodes(2, 1, "gpu0", 29400, "j7", None) and not nodes.hub
    assert nodes.launcher_args() == ["--nnodes", "2", "--node-rank", "1", "--master-addr", "gpu0",
                                     "--master-port", "29400", "--rdzv-id", "j7"]
    master = resolve(_args("--nnodes", "4", "--node-rank", "0", "--master-addr", "10.0.0.1", "--master-port", "1234",
                           "--link-port", "4321"), {})
    assert master == Nodes(4, 0, "10.0.0.1", 1234, "none", 4321) and master.hub
    assert resolve(_args("--nnodes", "2", "--node-rank", "0", "--rdzv-endpoint", "[::1]:5000"), {}).addr == "::1"
    assert resolve(_args(), {}) is None and resolve(_args("--nnodes", "1"), {}) is None


def test_pet_variables_are_read_as_torchrun_reads_them():
    env = {"PET_NNODES": "3", "PET_NODE_RANK": "2", "PET_MASTER_ADDR": "head", "PET_RDZV_ID": "x"}
    assert resolve(_args(), env) == Nodes(3, 2, "head", 29500, "x", None)
    assert resolve(_args("--node-rank", "1"), env).node_rank == 1  # a flag wins


def test_an_srun_step_with_one_task_per_node_fills_in_the_job():
    env = {"SLURM_JOB_ID": "4242", "SLURM_STEP_ID": "0", "SLURM_STEP_NUM_NODES": "3", "SLURM_STEP_NUM_TASKS": "3",
           "SLURM_NODEID": "1", "SLURM_STEP_NODELIST": "gpu[07-09]"}
    assert resolve(_args(), env) == Nodes(3, 1, "gpu07", 29500, "4242", None)
    with pytest.raises(CliError, match="one ptdash per node"):
        resolve(_args(), {**env, "SLURM_STEP_NUM_TASKS": "24"})
    assert resolve(_args(), {"SLURM_JOB_ID": "1", "SLURM_NODEID": "0"}) is None  # sbatch's shell, not a step


def test_slurm_host_lists_expand():
    assert expand_nodelist("node[01-03,07],gpu5,a[9-10]") == ["node01", "node02", "node03", "node07", "gpu5",
                                                             "a9", "a10"]
    with pytest.raises(CliError):
        expand_nodelist("node[a-b]")


@pytest.mark.parametrize("argv, message", [
    (("--nnodes", "2", "--rdzv-endpoint", "h:1"), "needs --node-rank"),
    (("--nnodes", "2", "--node-rank", "2", "--rdzv-endpoint", "h:1"), "not a node of 2"),
    (("--nnodes", "2", "--node-rank", "0"), "needs --rdzv-endpoint"),
    (("--nnodes", "two", "--node-rank", "0"), "whole number"),
    (("--nnodes", "2", "--node-rank", "0", "--rdzv-endpoint", "h:1", "--rdzv-backend", "c10d"), "static"),
])
def test_bad_combinations_are_refused_with_the_reason(argv, message):
    with pytest.raises(CliError, match=message):
        resolve(_args(*argv), {})


def test_a_worker_knows_its_node_and_where_the_hub_listens():
    env = {"WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "4", "GROUP_RANK": "1", "MASTER_ADDR": "head",
           "MASTER_PORT": "29500", "TORCHELASTIC_RUN_ID": "j"}
    where = place(env)
    assert (where.node, where.host, where.port, where.job, where.remote) == (1, "head", 29501, "j", True)
    assert place({**env, "PTDASH_LINK_PORT": "7000"}).port == 7000
    assert not place({**env, "GROUP_RANK": "0"}).remote
    assert place({**env, "LOCAL_WORLD_SIZE": "8"}) is None  # one node
    assert place({}) is None


def test_the_hub_listens_on_the_rendezvous_address_never_on_every_interface():
    from ptdash.nodes import is_local, local_address

    assert local_address("127.0.0.1") == "127.0.0.1" and local_address("localhost") in ("127.0.0.1", "::1")
    assert is_local("127.0.0.1") and not is_local("192.0.2.200")  # TEST-NET: no machine's own
    assert local_address("192.0.2.200") not in ("0.0.0.0", "::")  # the route's address, not a wildcard
