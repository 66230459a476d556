from typer.testing import CliRunner

from elastic_gpu.cli.sandbox import app

runner = CliRunner(env={"COLUMNS": "300"})  # no wrapping inside rich error boxes


def test_up_refuses_nodes_besides_a_cluster_file(tmp_path):
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text("nodeGroups: [{name: a, count: 1, gpus: 1}]\n")
    result = runner.invoke(app, ["up", "--cluster", str(cluster), "--gpu-nodes", "2",
                                 "--state-dir", str(tmp_path / "s")])
    assert result.exit_code == 2
    assert "leave out --gpu-nodes" in result.output


def test_up_without_binaries_says_how_to_build(tmp_path):
    result = runner.invoke(app, ["up", "--gpu-nodes", "1", "--kubeconfig", str(tmp_path / "kc"),
                                 "--state-dir", str(tmp_path / "s"),
                                 "--bin-dir", str(tmp_path / "empty")])
    assert result.exit_code == 1
    assert "hack/ensure-k8s.sh" in result.output
    assert not (tmp_path / "s" / "state.json").exists()


def test_bad_nodes_csv_is_a_usage_error(tmp_path):
    csv = tmp_path / "n.csv"
    csv.write_text("name,gpus\nx,1\n")
    result = runner.invoke(app, ["up", "--nodes-csv", str(csv), "--kubeconfig",
                                 str(tmp_path / "kc"), "--state-dir", str(tmp_path)])
    assert result.exit_code == 2
    assert "missing column" in result.output


def test_status_and_down_without_sandbox(tmp_path):
    assert runner.invoke(app, ["status", "--state-dir", str(tmp_path)]).exit_code == 1
    result = runner.invoke(app, ["down", "--state-dir", str(tmp_path)])
    assert result.exit_code == 0 and "no sandbox" in result.output


def test_scheduler_config_must_be_a_kube_scheduler_configuration(tmp_path):
    cfg = tmp_path / "s.yaml"
    cfg.write_text("kind: Deployment\n")
    result = runner.invoke(app, ["up", "--gpu-nodes", "1", "--scheduler-config", str(cfg),
                                 "--kubeconfig", str(tmp_path / "kc"),
                                 "--state-dir", str(tmp_path)])
    assert result.exit_code == 2
    assert "not a KubeSchedulerConfiguration" in result.output


def test_bad_extender_config_is_refused_before_anything_starts(tmp_path):
    cfg = tmp_path / "extender.yaml"
    cfg.write_text("loadAware: yes-please\n")
    result = runner.invoke(app, ["up", "--gpu-nodes", "1", "--extender-config", str(cfg),
                                 "--kubeconfig", str(tmp_path / "kc"),
                                 "--state-dir", str(tmp_path / "s")])
    assert result.exit_code == 2
    assert "--extender-config" in result.output and "loadAware" in result.output
    assert "must be true or false" in result.output
    assert not (tmp_path / "s").exists()


def test_extender_config_with_bare_is_refused(tmp_path):
    cfg = tmp_path / "extender.yaml"
    cfg.write_text("loadAware: true\n")
    result = runner.invoke(app, ["up", "--gpu-nodes", "1", "--bare", "--extender-config",
                                 str(cfg), "--state-dir", str(tmp_path / "s")])
    assert result.exit_code == 2
    assert "--bare runs no extender" in result.output
