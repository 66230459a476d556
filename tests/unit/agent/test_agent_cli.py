"""`egpu agent` as a process: bad input exits with a clear message; a fake node serves."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

from egpu_testing.kubelet import KubeletDouble

EGPU = [sys.executable, "-m", "elastic_gpu.cli.main", "agent"]


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*EGPU, *args], capture_output=True, text=True, timeout=60, check=False)


def test_broken_config_exits_2_naming_the_field(tmp_path: Path) -> None:
    config = tmp_path / "agent.yaml"
    config.write_text("migStrategy: mixd\n")
    result = run("--node", "n1", "--config", str(config), "--no-api")
    assert result.returncode == 2
    assert "migStrategy" in result.stderr and "'none', 'single' or 'mixed'" in result.stderr


def test_no_nvidia_driver_exits_1_and_serves_nothing(plugin_dir: Path) -> None:
    config = plugin_dir / "agent.yaml"
    config.write_text(f"backend: nvml\ndevicePluginDirectory: {plugin_dir}\n")
    result = run("--node", "n1", "--config", str(config), "--no-api")
    assert result.returncode == 1
    assert "NVML library (libnvidia-ml.so.1) not found" in result.stderr
    assert not list(plugin_dir.glob("egpu-*.sock"))


def test_fake_node_agent_registers_and_stops_cleanly(plugin_dir: Path) -> None:
    (plugin_dir / "inv.yaml").write_text(
        "boards: [{id: bi0, model: BI-V150, chips: 2, memoryMiB: 32768}]\n")
    config = plugin_dir / "agent.yaml"
    config.write_text(f"backend: fake\nfake: {{inventory: inv.yaml}}\nsplitBoard: true\n"
                      f"resources: {{gpu: iluvatar.com/gpu}}\ndevicePluginDirectory: {plugin_dir}\n")
    kubelet = KubeletDouble(plugin_dir)
    kubelet.start()
    process = subprocess.Popen([*EGPU, "--node", "n1", "--config", str(config), "--no-api"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert kubelet.wait_for(lambda: len(kubelet.devices("iluvatar.com/gpu")) == 2, 30)
        assert kubelet.devices("iluvatar.com/gpu") == {"bi0-chip0": "Healthy",
                                                       "bi0-chip1": "Healthy"}
        process.send_signal(signal.SIGTERM)
        assert process.wait(15) == 0
    finally:
        if process.poll() is None:
            process.kill()
        kubelet.stop()


def test_dra_mode_without_the_api_exits_2_and_serves_nothing(plugin_dir: Path) -> None:
    (plugin_dir / "inv.yaml").write_text("cards: [{model: A100, memoryMiB: 40960}]\n")
    config = plugin_dir / "agent.yaml"
    config.write_text(f"backend: fake\nfake: {{inventory: inv.yaml}}\ndra:\n  enabled: true\n"
                      f"  pluginDirectory: {plugin_dir}/p\n  registryDirectory: {plugin_dir}/r\n")
    result = run("--node", "n1", "--config", str(config), "--no-api")
    assert result.returncode == 2
    assert "--no-api cannot serve dra.enabled" in result.stderr
    assert not (plugin_dir / "r").exists() and not (plugin_dir / "p").exists()
