from __future__ import annotations

from pathlib import Path

import pytest
from sim_helpers import write_nodes, write_pods

from elastic_gpu.core.request import RequestKind
from elastic_gpu.sim.trace import TraceError, load_nodes, load_tasks


def test_only_gpu_nodes_are_loaded_with_their_cards(tmp_path: Path) -> None:
    nodes = load_nodes(write_nodes(tmp_path / "nodes.csv"))
    assert [n.name for n in nodes] == ["g8-0", "g8-1", "t4-0", "t4-1", "p1-0"]
    assert nodes[0].gpu_count == 8 and nodes[0].models == {"G2"}
    assert nodes[2].cpu_milli == 16000 and nodes[2].memory_mib == 65536


def test_tasks_become_requests_of_the_right_kind(tmp_path: Path) -> None:
    tasks = {t.name: t for t in load_tasks(write_pods(tmp_path / "pods.csv"))}
    kinds = {t.request().containers[0].kind for t in tasks.values()}
    assert kinds == {RequestKind.NONE, RequestKind.SHARE, RequestKind.WHOLE}
    spec = next(t for t in tasks.values() if t.gpu_spec == "G2|P100")
    assert spec.request().allowed_models == {"G2", "P100"}


def test_five_column_files_load(tmp_path: Path) -> None:
    tasks = load_tasks(write_pods(tmp_path / "pods.csv", five_columns=True))
    assert len(tasks) == 60 and all(t.gpu_spec == "" for t in tasks)


@pytest.mark.parametrize(("text", "message"), [
    ("name,cpu_milli,memory_mib,num_gpu\np,1,1,0\n", "missing column(s) gpu_milli"),
    ("name,cpu_milli,memory_mib,num_gpu,gpu_milli\np,x,1,0,0\n", ":2: column cpu_milli='x'"),
    ("name,cpu_milli,memory_mib,num_gpu,gpu_milli\np,1,1,2,500\n", "whole GPUs"),
    ("name,cpu_milli,memory_mib,num_gpu,gpu_milli\np,1,-5,0,0\n", "negative"),
    ("name,cpu_milli,memory_mib,num_gpu,gpu_milli\n", "no tasks"),
])
def test_bad_pod_files_name_what_is_wrong(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "pods.csv"
    path.write_text(text)
    with pytest.raises(TraceError) as err:
        load_tasks(path)
    assert message in str(err.value) and str(path) in str(err.value)


def test_bad_node_files_name_what_is_wrong(tmp_path: Path) -> None:
    path = tmp_path / "nodes.csv"
    path.write_text("sn,cpu_milli,memory_mib,gpu,model\nn,1,1,2,\n")
    with pytest.raises(TraceError, match="needs a model"):
        load_nodes(path)
    with pytest.raises(TraceError, match="cannot open"):
        load_nodes(tmp_path / "missing.csv")
