"""Who may connect to a server's Unix socket (issue 52, item 4), with real servers run as root
and a client run as `nobody`: by default the socket is the owner's (0600 in a 0700 folder), so
another user holding the secret connects over TCP only, with no same-node copies; `cairn cluster start --same-node-other-users true` makes it 0666 in
a traversable folder (the secret and logs stay 0600) and the other user, handed a copy of the
cluster file, puts same-node and reads back; with `--socket-group G` it is 0660 of group G and
the cluster file 0640 of G."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import tempfile
from pathlib import Path

import numpy as np
import pytest

import cairn
from cairn import _native, cluster

from .conftest import PY, ROOT, check, status_total

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="runs servers as root and a client as nobody")
NOBODY = 65534


@pytest.fixture
def shared_dir():
    """A folder `nobody` can traverse (pytest's own are root's only)."""
    d = Path(tempfile.mkdtemp(prefix="cairn-access-", dir="/tmp"))
    d.chmod(0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def _client(d: Path) -> Path:
    """tests/c/other_user.c built against target/release, where nobody can run it."""
    lib = ROOT / "target" / "release"
    exe = d / "other_user"
    check(subprocess.run(["cc", str(ROOT / "tests/c/other_user.c"), "-Wall", "-Werror", "-I", str(ROOT / "crates/cairn-capi/include"),
                          "-L", str(lib), "-lcairn", f"-Wl,-rpath,{lib}", "-o", str(exe)], capture_output=True, text=True))
    return exe


def _as_nobody(exe: Path, file: Path, d: Path, transport: str = "auto", *args: str) -> subprocess.CompletedProcess[str]:
    """Runs the client as nobody with its own copy of the cluster file (handed over by its owner)."""
    mine = d / "nobody-cluster.json"
    shutil.copy(file, mine)
    os.chown(mine, NOBODY, NOBODY)
    mine.chmod(0o600)
    cfg = d / "nobody.toml"
    cfg.write_text(f'engine = "staging"\n[staging]\ncluster = "{mine}"\ntimeout = 5\ntransport = "{transport}"\n')
    cfg.chmod(0o644)
    name = args[0] if args else f"other-{transport}"
    return subprocess.run([str(exe), str(cfg), name, *args[1:]], capture_output=True, text=True, timeout=60, user=NOBODY, group=NOBODY,
                          cwd=d)


def _mode(p: Path) -> int:
    return stat.S_IMODE(p.stat().st_mode)


def _cli_start(file: Path, *flags: str) -> None:
    out = subprocess.run([PY, "-m", "cairn", "cluster", "start", "--cluster", str(file), "--servers", "1", "--memory", "64MiB",
                          "--prefault", "0", *flags], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert out.returncode == 0, out.stderr


def test_by_default_the_socket_is_the_owners_and_another_user_gets_no_same_node_path(shared_dir):
    file = shared_dir / "c.json"
    _cli_start(file)
    try:
        d = cluster.entries_dir(file)
        assert (_mode(d), _mode(d / "server-0.sock"), _mode(d / "secret"), _mode(d / "server-0.log")) == (0o700, 0o600, 0o600, 0o600)
        out = _as_nobody(_client(shared_dir), file, shared_dir)
        # The secret authenticates over TCP; the socket (and its folder) stay closed to it.
        assert out.returncode == 0 and "other user: ok" in out.stdout, out.stdout + out.stderr
        assert status_total(file, "same_node_bytes") == 0
    finally:
        cluster.stop(file)


def test_same_node_other_users_lets_another_user_put_same_node_and_read(shared_dir):
    file = shared_dir / "c.json"
    _cli_start(file, "--same-node-other-users", "true")
    try:
        d = cluster.entries_dir(file)
        assert (_mode(d), _mode(d / "server-0.sock"), _mode(d / "secret"), _mode(d / "server-0.log"), _mode(file)) == \
            (0o711, 0o666, 0o600, 0o600, 0o600)
        out = _as_nobody(_client(shared_dir), file, shared_dir)
        assert out.returncode == 0 and "other user: ok" in out.stdout, out.stdout + out.stderr
        copied = status_total(file, "same_node_bytes")
        assert copied >= 512 << 10, f"the put went same-node: {copied} bytes"
    finally:
        cluster.stop(file)


def test_another_users_reader_is_never_handed_a_mapping_of_a_segment(shared_dir):
    """Root's writer puts into shared segments (root's); `nobody`, allowed the same-node path,
    reads them back as payloads: a segment is mapped only by readers of the user it was leased
    to (whose writer may write into it anyway), so nothing of another user is ever mapped. Root's
    own reader reads the same objects out of mappings of those segments."""
    file = shared_dir / "c.json"
    _cli_start(file, "--same-node-other-users", "true")
    try:
        x = 0.5 * np.arange(65536)
        with cairn.open("rootdata", "w", engine="staging", cluster=file, shared_min=64 << 10) as w:
            w.define("x", "f8", x.shape)
            with w.step(0):
                w.put("x", x)
        assert status_total(file, "shared_bytes") >= x.nbytes, "root's put went into segments"
        out = _as_nobody(_client(shared_dir), file, shared_dir, "auto", "rootdata", "read")
        assert out.returncode == 0 and "other user: ok" in out.stdout, out.stdout + out.stderr
        assert status_total(file, "mapped_gets") == 0, "nobody was handed a mapping of root's segment"
        with cairn.open("rootdata", "r", engine="staging", cluster=file) as r:
            assert np.array_equal(r.get("x", 0), x)
        assert status_total(file, "mapped_gets") > 0, "root's reader reads its own segments mapped"
    finally:
        cluster.stop(file)


def test_a_socket_group_gets_the_socket_and_the_cluster_file(shared_dir):
    file = shared_dir / "c.json"
    _cli_start(file, "--same-node-other-users", "true", "--socket-group", str(NOBODY))
    try:
        d = cluster.entries_dir(file)
        sock = d / "server-0.sock"
        assert (_mode(d), _mode(sock), _mode(file), _mode(d / "secret")) == (0o750, 0o660, 0o640, 0o600)
        assert sock.stat().st_gid == file.stat().st_gid == d.stat().st_gid == NOBODY
        out = _as_nobody(_client(shared_dir), file, shared_dir)
        assert out.returncode == 0 and "other user: ok" in out.stdout, out.stdout + out.stderr
    finally:
        cluster.stop(file)


def _victim(d: Path) -> Path:
    """tests/c/setuid_victim.c built setuid root."""
    exe = d / "setuid_victim"
    check(subprocess.run(["cc", str(ROOT / "tests/c/setuid_victim.c"), "-Wall", "-Werror", "-o", str(exe)], capture_output=True, text=True))
    os.chown(exe, 0, 0)
    exe.chmod(0o4755)
    return exe


def _attacker() -> Path:
    """crates/cairn-server/examples/exec_attack.rs (cargo test builds the examples; built here
    if it has not)."""
    exe = ROOT / "target" / "release" / "examples" / "exec_attack"
    if not exe.exists():
        check(subprocess.run(["cargo", "build", "--release", "-q", "-p", "cairn-server", "--example", "exec_attack"], cwd=ROOT,
                             capture_output=True, text=True))
    return exe


def _in_pid_namespace() -> list[str]:
    """`unshare` into a new pid namespace (as the pid-reuse test runs), where this machine allows one."""
    probe = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", "true"], capture_output=True)
    return ["unshare", "--pid", "--fork", "--mount-proc"] if probe.returncode == 0 else []


def test_a_connection_never_reaches_a_setuid_program_its_process_execs(shared_dir):
    """Issue 52, item 1, end to end: nobody connects to root's server (started with
    --same-node-other-users true), forks a child that keeps the connection and execs a
    setuid-root program holding a root-only file in memory. The child names those bytes in
    same-node puts: a right guess of their crc is refused as a wrong one is, no error tells the
    crc, nothing is stored, and the program's copy is untouched. The same user's own puts and
    gets still work, same-node and over TCP."""
    if os.statvfs(shared_dir).f_flag & os.ST_NOSUID:
        pytest.skip(f"{shared_dir} is mounted nosuid: a setuid program cannot run there")
    secret = shared_dir / "root-only"
    secret.write_bytes(bytes(range(256)) * 16)
    secret.chmod(0o600)
    want = _native.crc32c(np.frombuffer(secret.read_bytes(), np.uint8))
    victim, attacker = _victim(shared_dir), _attacker()
    file = shared_dir / "c.json"
    _cli_start(file, "--same-node-other-users", "true")
    try:
        sock = cluster.entries_dir(file) / "server-0.sock"
        key = (cluster.entries_dir(file) / "secret").read_text().strip()
        run = subprocess.run([*_in_pid_namespace(), "setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups",
                              str(attacker), str(sock), str(victim), str(secret), str(want)],
                             capture_output=True, text=True, timeout=60, env={**os.environ, "CAIRN_SECRET": key})
        if "victim did not run" in run.stdout and "euid" in run.stdout:
            pytest.skip(f"the setuid bit took no effect here: {run.stdout.strip()}")
        assert run.returncode == 0 and "| safe" in run.stdout, run.stdout + run.stderr
        print(run.stdout)
        assert "right-guess put refused" in run.stdout and "victim: intact" in run.stdout, run.stdout
        # The same user's ordinary clients: same-node over the socket, and over TCP.
        out = _as_nobody(_client(shared_dir), file, shared_dir)
        assert out.returncode == 0 and "other user: ok" in out.stdout, out.stdout + out.stderr
        out = _as_nobody(_client(shared_dir), file, shared_dir, transport="tcp")
        assert out.returncode == 0 and "other user: ok" in out.stdout, out.stdout + out.stderr
    finally:
        cluster.stop(file)
