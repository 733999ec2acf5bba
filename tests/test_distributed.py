"""Multi-node training through torchrun: two nodes of one process each, on this machine."""

import os
import re
import socket
import subprocess
import sys

import pytest
from conftest import HANG_GUARD_S


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.mark.slow
def test_two_nodes_through_torchrun_finish_and_agree(bake, tmp_path):
    """Each node is its own torchrun with its own folder; both finish, report the same synced metrics, rank 0 writes."""
    root = bake()
    port = str(free_port())
    env = {**os.environ, "PYTHONPATH": str(root / "src"), "PYTHONUNBUFFERED": "1"}
    nodes = []
    for rank in (0, 1):
        folder = tmp_path / f"node{rank}"
        folder.mkdir()
        command = [
            *(sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc_per_node", "1"),
            *("--node_rank", str(rank), "--master_addr", "127.0.0.1", "--master_port", port),
            *(str(root / "train.py"), "--config", str(root / "configs" / "synthetic.yaml")),
            *("--accelerator", "cpu", "--num_nodes", "2", "--devices", "1", "--strategy", "ddp", "--max_epochs", "1"),
            *("--trainer.limit_train_batches", "4", "--trainer.limit_val_batches", "2"),
        ]
        nodes.append(
            subprocess.Popen(
                command,
                cwd=folder,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
    try:
        outputs = [node.communicate(timeout=HANG_GUARD_S)[0] for node in nodes]
    finally:  # a hang leaves no node behind
        for node in nodes:
            if node.poll() is None:
                node.kill()
                node.communicate()
    for node, output in zip(nodes, outputs, strict=True):
        assert node.returncode == 0, output
    reports = [re.search(r"rank (\d)/2 fit finished: (.*)", output) for output in outputs]
    assert [report.group(1) for report in reports] == ["0", "1"], outputs
    assert reports[0].group(2) == reports[1].group(2) and "val/acc=" in reports[0].group(2)
    checkpoints = sorted(path.name for path in (tmp_path / "node0").rglob("*.ckpt"))
    assert len(checkpoints) == 2 and "last.ckpt" in checkpoints
    assert not list((tmp_path / "node1").rglob("*.ckpt"))
