"""What a user gets wrong, and what the client says."""

from __future__ import annotations

import subprocess
import sys

import pytest

import kestrel


def test_a_client_with_no_server_says_how_to_start_one(tmp_path):
    with pytest.raises(kestrel.NoServer, match="kestrel server start"):
        kestrel.Client(server_dir=tmp_path)


def test_a_client_of_a_dead_server_says_so(tmp_path):
    cluster = kestrel.LocalCluster(workers=0, directory=tmp_path)
    cluster.server.kill()
    cluster.server.wait()
    with pytest.raises(kestrel.NoServer, match="cannot connect"):
        kestrel.Client(server_dir=tmp_path)
    cluster.close()


def test_submit_takes_functions_and_command_lines_only(client):
    with pytest.raises(TypeError, match="function or a command line"):
        client.submit(42)
    with pytest.raises(TypeError, match="no arguments"):
        client.submit(["echo"], "hi")


def test_a_bad_option_value_is_refused_before_anything_runs(client):
    with pytest.raises(kestrel.KestrelError, match="timeout"):
        client.submit(pow, 2, 2, timeout=-1)


def test_the_kestrel_command_runs_from_the_package():
    out = subprocess.run(
        [sys.executable, "-m", "kestrel", "--version"], capture_output=True, text=True, check=True
    )
    assert out.stdout.startswith("kestrel ")
    bad = subprocess.run(
        [sys.executable, "-m", "kestrel", "no-such-command"], capture_output=True, check=False
    )
    assert bad.returncode == 2


def test_a_function_pickled_by_value_keeps_its_file_in_the_traceback(client):
    def nested_raiser():
        raise LookupError("from a nested function")

    with pytest.raises(LookupError) as info:
        client.submit(nested_raiser).result(30)
    remote = str(info.value.__cause__)
    assert f'File "{__file__}"' in remote, remote
    assert 'raise LookupError("from a nested function")' in remote, remote
