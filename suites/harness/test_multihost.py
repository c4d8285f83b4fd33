"""Multi-host runs as documented, for real: xdist workers over ssh (issue 18, item 11).

A throwaway ``sshd`` listens on 127.0.0.1 at a free high port, with host and user keys made
in a temporary directory; the client takes them from an ssh config file
(``StrictHostKeyChecking no``). Through ``--tx 2*ssh=...//chdir=<the project>`` workers, the
harness self-tests and an allocator suite pass, and a failing death test's report names the
worker's host. sshd is stopped by its pid; nothing is left running. Marked ``multihost``: runs
only with ``--multihost`` (``ci/check.sh --multihost``); skips with the reason where sshd or
ssh is not installed, or cannot start.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.multihost

ROOT = Path(__file__).resolve().parents[2]
ALIAS = "devmem-multihost"


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture(scope="module")
def ssh_config(tmp_path_factory):
    """The path of an ssh config whose host ``devmem-multihost`` is a throwaway sshd here."""
    sshd = shutil.which("sshd") or (
        "/usr/sbin/sshd" if os.access("/usr/sbin/sshd", os.X_OK) else None
    )
    for name, found in (
        ("sshd", sshd),
        ("ssh", shutil.which("ssh")),
        ("ssh-keygen", shutil.which("ssh-keygen")),
    ):
        if found is None:
            pytest.skip(f"{name} is not installed (apt-get install openssh-server openssh-client)")
    home = tmp_path_factory.mktemp("sshd")
    for key in ("host_key", "user_key"):
        subprocess.run(
            ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(home / key)], check=True
        )
    (home / "authorized_keys").write_text((home / "user_key.pub").read_text())
    port = _free_port()
    (home / "sshd_config").write_text(
        f"ListenAddress 127.0.0.1\nPort {port}\nHostKey {home / 'host_key'}\n"
        f"AuthorizedKeysFile {home / 'authorized_keys'}\nPasswordAuthentication no\n"
        "KbdInteractiveAuthentication no\nPubkeyAuthentication yes\n"
        "PermitRootLogin prohibit-password\nUsePAM no\nStrictModes no\n"
        f"PidFile {home / 'sshd.pid'}\n"
    )
    config = home / "ssh_config"
    config.write_text(
        f"Host {ALIAS}\n  HostName 127.0.0.1\n  Port {port}\n  User {_user()}\n"
        f"  IdentityFile {home / 'user_key'}\n  IdentitiesOnly yes\n"
        "  StrictHostKeyChecking no\n  UserKnownHostsFile /dev/null\n  LogLevel ERROR\n"
    )
    if os.geteuid() == 0:
        os.makedirs("/run/sshd", exist_ok=True)  # sshd's privilege separation directory
    log = open(home / "sshd.log", "wb")  # noqa: SIM115  (closed below, after sshd)
    server = subprocess.Popen(
        [sshd, "-D", "-e", "-f", str(home / "sshd_config")], stdout=log, stderr=log
    )
    try:
        _wait_for_ssh(config, server, home / "sshd.log")
        yield config
    finally:
        server.send_signal(signal.SIGTERM)  # by its pid: nothing else is touched
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        log.close()


def _user() -> str:
    import pwd

    return pwd.getpwuid(os.getuid()).pw_name


def _wait_for_ssh(config: Path, server: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if server.poll() is not None:
            pytest.skip(f"sshd could not start: {log.read_text(errors='replace').strip()[-500:]}")
        probe = subprocess.run(
            ["ssh", "-F", str(config), ALIAS, "true"], capture_output=True, timeout=30, check=False
        )
        if probe.returncode == 0:
            return
        time.sleep(0.2)
    pytest.skip(f"ssh to the throwaway sshd failed: {probe.stderr.decode(errors='replace')[-500:]}")


def _tx(config: Path, workers: int, chdir: Path) -> str:
    return f"{workers}*ssh={ALIAS}//ssh_config={config}//python={sys.executable}//chdir={chdir}"


def _pytest(*args: str, cwd: Path) -> tuple[subprocess.CompletedProcess[str], float]:
    start = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:randomly", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    return result, time.monotonic() - start


def test_harness_and_allocator_suites_pass_through_ssh_workers(ssh_config):
    selection = [
        "suites/harness/test_endings.py",
        "suites/harness/test_matrix.py",
        "suites/allocator/test_leak_bound.py",
    ]
    copies = [ROOT / name for name in ("pytest", "_pytest") if not (ROOT / name).exists()]
    try:
        result, wall_s = _pytest("-q", "-d", "--tx", _tx(ssh_config, 2, ROOT), *selection, cwd=ROOT)
    finally:
        for copy in copies:  # xdist copies pytest's own package into each worker's chdir
            shutil.rmtree(copy, ignore_errors=True)

    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    passed = int(re.search(r"(\d+) passed", output).group(1))
    assert passed >= 60, output[-2000:]
    assert "INTERNALERROR" not in output
    print(f"multihost: {passed} items through 2 ssh workers in {wall_s:.1f} s")


FAILING = """
import os


def lives():
    return os.getpid()


def test_expects_an_abort(death):
    death.run(lives).assert_aborted("fatal")
"""


def test_a_failure_report_names_the_worker_s_host(ssh_config, tmp_path):
    (tmp_path / "test_remote_failure.py").write_text(FAILING)
    (tmp_path / "pyproject.toml").write_text("[tool.pytest.ini_options]\n")  # the rootdir
    result, _ = _pytest(
        "-d", "--tx", _tx(ssh_config, 1, tmp_path), "test_remote_failure.py", cwd=tmp_path
    )

    output = result.stdout + result.stderr
    assert result.returncode == 1, output[-4000:]
    host = socket.gethostname()
    assert re.search(
        rf"target:   test_remote_failure:lives  \(style \w+, pid \d+, .*, host {host}\)", output
    ), output[-4000:]
    assert "[gw0]" in output
    assert "death test failed: the child did not die: it exited with status 0" in output
