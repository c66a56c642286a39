"""``mtl-cog launch`` checks its own values before torchrun sees them: one ``error:`` line each, nothing started."""

from __future__ import annotations

from pathlib import Path

import pytest

from mtl_cog.cli import launch
from mtl_cog.errors import run_cli

CONFIG = Path(__file__).resolve().parents[1] / "configs" / "accelerate" / "multi_process.yaml"
TWO_MACHINES = ["--num_machines", "2", "--num_processes", "2", "--main_process_ip", "10.0.0.1",
                "--main_process_port", "29500", "--machine_rank", "0"]


def refused(argv: list[str], tmp_path: Path, capsys) -> str:
    marker = tmp_path / "started"
    script = tmp_path / "script.py"
    script.write_text(f"open({str(marker)!r}, 'w').close()\n")  # proof that a process started
    capsys.readouterr()
    with pytest.raises(SystemExit) as info:
        run_cli(lambda: launch.main([*argv, str(script)]))
    err = capsys.readouterr().err
    assert info.value.code == 2 and "Traceback" not in err and err.startswith("error: ") and err.count("\n") == 1, err
    assert not marker.exists()
    return err


@pytest.mark.parametrize("argv, message", [
    (["--num_processes", "0"], "--num_processes must be at least 1"),
    (["--config_file", str(CONFIG), "--num_processes", "0"], "--num_processes must be at least 1"),
    (["--num_processes", "-3"], "--num_processes must be at least 1"),
    (["--num_machines", "0"], "--num_machines must be at least 1"),
    (["--num_machines", "-1"], "--num_machines must be at least 1"),
    (["--main_process_port", "70000"], "port number 0 to 65535, got 70000"),
    ([*TWO_MACHINES[:-4], "--main_process_port", "70000", "--machine_rank", "0"], "port number 1 to 65535"),
    ([*TWO_MACHINES[:-4], "--main_process_port", "0", "--machine_rank", "0"], "only works on one machine"),
    (["--main_process_ip", "not an ip"], "IP address or host name, got 'not an ip'"),
    ([*TWO_MACHINES[:-1], "2"], "--machine_rank must be 0 to 1"),
    ([*TWO_MACHINES[:-1], "-1"], "--machine_rank must be 0 to 1"),
    (["--num_machines", "2", "--num_processes", "2", "--machine_rank", "1"], "needs --main_process_ip"),
    ([*TWO_MACHINES[:2], "--num_processes", "3", *TWO_MACHINES[4:]], "cannot be split evenly over 2 machines"),
    (["--cpu", "--multi_gpu"], "only use one of"),  # Accelerate's own refusal, as one line
    (["--config_file", "/no/such/accelerate.yaml"], "does not exist"),
])
def test_launch_values_are_refused_before_anything_starts(argv, message, tmp_path, capsys):
    assert message in refused(argv, tmp_path, capsys)


@pytest.mark.parametrize("address", ["10.0.0.1", "::1", "node-07", "node07.cluster.example.org", "localhost"])
def test_addresses_and_host_names_are_accepted(address):
    assert launch.is_address(address)


def test_one_process_still_launches(tmp_path):
    marker = tmp_path / "started"
    script = tmp_path / "script.py"
    script.write_text(f"open({str(marker)!r}, 'w').close()\n")
    launch.main(["--num_processes", "1", "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
                 str(script)])
    assert marker.exists()
