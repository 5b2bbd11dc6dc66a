"""vagrant/provision.sh's decisions, without root, a VM or this machine's apt state:

* the Python it gives `make setup`, by the guest's release, for fake os-release files
  (LIGHTPIPE_OS_RELEASE) through `provision.sh --print-python`, and the one-line refusal
  (exit 2, naming LP_BOX's boxes) before anything is installed;
* Grafana's apt source (`grafana_repo`, the script sourced: functions only) against a
  repository that does not answer, serves no key, is badly signed or is gone: the source is
  removed (so later apt-get updates keep working) and one line says what to do. apt-get runs
  for real where it runs at all, in a sandbox (APT_CONFIG: its lists, cache and lock in a
  temporary directory; LIGHTPIPE_APT_ETC: the key and the source there), never on this
  machine's /etc/apt or /var/lib/apt.

The same script run as root with Grafana unreachable: tests/test_vagrant.py."""

from __future__ import annotations

import hashlib
import http.server
import os
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PROVISION = REPO / "vagrant" / "provision.sh"

OS_RELEASES = {
    "debian12": """PRETTY_NAME="Debian GNU/Linux 12 (bookworm)"
NAME="Debian GNU/Linux"
VERSION_ID="12"
VERSION="12 (bookworm)"
VERSION_CODENAME=bookworm
ID=debian
HOME_URL="https://www.debian.org/"
""",
    "debian13": """PRETTY_NAME="Debian GNU/Linux 13 (trixie)"
NAME="Debian GNU/Linux"
VERSION_ID="13"
VERSION="13 (trixie)"
VERSION_CODENAME=trixie
DEBIAN_VERSION_FULL=13.1
ID=debian
""",
    "ubuntu2204": """PRETTY_NAME="Ubuntu 22.04.5 LTS"
NAME="Ubuntu"
VERSION_ID="22.04"
VERSION="22.04.5 LTS (Jammy Jellyfish)"
VERSION_CODENAME=jammy
ID=ubuntu
ID_LIKE=debian
UBUNTU_CODENAME=jammy
""",
    "ubuntu2404": """PRETTY_NAME="Ubuntu 24.04.1 LTS"
NAME="Ubuntu"
VERSION_ID="24.04"
VERSION="24.04.1 LTS (Noble Numbat)"
VERSION_CODENAME=noble
ID=ubuntu
ID_LIKE=debian
UBUNTU_CODENAME=noble
LOGO=ubuntu-logo
""",
    "ubuntu2004": """NAME="Ubuntu"
VERSION="20.04.6 LTS (Focal Fossa)"
ID=ubuntu
ID_LIKE=debian
PRETTY_NAME="Ubuntu 20.04.6 LTS"
VERSION_ID="20.04"
VERSION_CODENAME=focal
UBUNTU_CODENAME=focal
""",
    "unknown": """NAME="Frobnix"
ID=frobnix
VERSION_ID=7
PRETTY_NAME='Frobnix OS 7'
""",
}


def fake_python3(bindir: Path, version: str) -> None:
    """A `python3` on PATH that reports VERSION (what provision.sh asks an unknown release)."""
    bindir.mkdir(parents=True, exist_ok=True)
    py = bindir / "python3"
    py.write_text(f"#!/bin/sh\necho {version}\n")
    py.chmod(0o755)


def print_python(tmp_path: Path, release: str, *, path: str | None = None,
                 argv: tuple[str, ...] = ("--print-python",)) -> subprocess.CompletedProcess[str]:
    """provision.sh ARGV with RELEASE (a name in OS_RELEASES, or a file's text) as the
    machine's os-release."""
    f = tmp_path / "os-release"
    f.write_text(OS_RELEASES.get(release, release))
    env = {**os.environ, "LIGHTPIPE_OS_RELEASE": str(f)}
    if path is not None:
        env["PATH"] = path
    return subprocess.run(["bash", str(PROVISION), *argv], capture_output=True, text=True,
                          env=env, timeout=60, check=False)


@pytest.mark.parametrize(("release", "python", "why"), [
    ("debian12", "python3", "Debian 12 (bookworm): python3 (3.11)"),
    ("debian13", "python3", "Debian 13 (trixie): python3 (3.13)"),
    ("ubuntu2404", "python3", "Ubuntu 24.04 (noble): python3 (3.12)"),
    ("ubuntu2204", "python3.11", "Ubuntu 22.04 (jammy): python3 is 3.10, so python3.11 and "
     "python3.11-venv from Ubuntu's archive (universe)"),
])
def test_the_python_by_release(tmp_path: Path, release: str, python: str, why: str) -> None:
    """Known releases are decided by their os-release alone (no python3 asked: the fake one
    on PATH would say 3.8)."""
    fake_python3(tmp_path / "bin", "3.8")
    r = print_python(tmp_path, release, path=f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    assert r.returncode == 0, r.stderr
    assert r.stdout == f"{python}\n"
    pkgs = "python3.11 python3.11-venv" if python == "python3.11" else "python3 python3-venv"
    assert r.stderr == f"provision: {why}; make setup PYTHON={python} (apt: {pkgs})\n"


def test_ubuntu_2004_is_refused_in_one_line_naming_the_boxes(tmp_path: Path) -> None:
    r = print_python(tmp_path, "ubuntu2004")
    assert r.returncode == 2 and r.stdout == ""
    lines = r.stderr.splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("provision: Ubuntu 20.04 (focal) has Python 3.8 and no Python "
                               "3.11-3.13 in its archive; use the default box (LP_BOX unset: "
                               "debian/bookworm64) or LP_BOX="), lines[0]
    assert "bento/ubuntu-22.04" in lines[0] and "bento/ubuntu-24.04" in lines[0]


def test_the_refusal_comes_before_anything_is_installed(tmp_path: Path) -> None:
    """Provisioning itself (not --print-python) on Ubuntu 20.04: exit 2 with the same one
    line, before the root check and before apt-get, dpkg or make is run (fakes of them on
    PATH record any call; safe as root too)."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    calls = tmp_path / "calls"
    for tool in ("apt-get", "apt-cache", "dpkg-query", "make", "curl", "gpg", "modprobe"):
        (bindir / tool).write_text(f"#!/bin/sh\necho {tool} \"$@\" >> {calls}\nexit 1\n")
        (bindir / tool).chmod(0o755)
    r = print_python(tmp_path, "ubuntu2004", path=f"{bindir}:{os.environ['PATH']}",
                     argv=("--repo", str(REPO), "--listen", "127.0.0.1"))
    assert r.returncode == 2, r.stderr
    assert len(r.stderr.splitlines()) == 1 and "has Python 3.8" in r.stderr
    assert "LP_BOX" in r.stderr
    assert not calls.exists(), calls.read_text()


@pytest.mark.parametrize(("version", "ok"), [("3.12", True), ("3.13", True), ("3.10", False),
                                             ("3.14", False), ("", False)])
def test_an_unknown_release_uses_its_python3_if_supported(tmp_path: Path, version: str,
                                                         ok: bool) -> None:
    fake_python3(tmp_path / "bin", version)
    r = print_python(tmp_path, "unknown", path=f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    if ok:
        assert r.returncode == 0 and r.stdout == "python3\n", r.stderr
        assert r.stderr.startswith(f"provision: Frobnix OS 7: python3 ({version});"), r.stderr
    else:
        assert r.returncode == 2 and r.stdout == ""
        assert len(r.stderr.splitlines()) == 1, r.stderr
        assert r.stderr.startswith(f"provision: Frobnix OS 7: python3 is Python {version or '?'}, "
                                   "not 3.11-3.13"), r.stderr
        assert "LP_BOX unset: debian/bookworm64" in r.stderr


def test_an_unknown_release_without_python3(tmp_path: Path) -> None:
    """--print-python cannot tell (provisioning would install python3 first, then decide)."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    for tool in ("dirname", "head"):  # (all the script runs before deciding)
        (bindir / tool).symlink_to(shutil.which(tool) or f"/usr/bin/{tool}")
    f = tmp_path / "os-release"
    f.write_text(OS_RELEASES["unknown"])
    r = subprocess.run(["/bin/bash", str(PROVISION), "--print-python"], capture_output=True,
                       text=True, timeout=60, check=False,
                       env={"PATH": str(bindir), "LIGHTPIPE_OS_RELEASE": str(f)})
    assert r.returncode == 2 and r.stdout == "", r.stderr
    assert r.stderr == ("provision: Frobnix OS 7: python3 is not installed, so its version is "
                        "unknown (LightPipe needs 3.11-3.13)\n")


def test_os_release_is_read_as_data_and_bounded(tmp_path: Path) -> None:
    """Values are never evaluated (a command substitution stays text), odd characters are
    dropped, and a huge file is read only in its first lines."""
    marker = tmp_path / "ran"
    hostile = (f'ID="$(touch {marker})"\nVERSION_ID=`touch {marker}`\n'
               f"PRETTY_NAME=\"x; touch {marker}\"\n")
    fake_python3(tmp_path / "bin", "3.12")
    path = f"{tmp_path / 'bin'}:{os.environ['PATH']}"
    r = print_python(tmp_path, hostile, path=path)
    assert not marker.exists()
    assert r.returncode == 0 and r.stdout == "python3\n", r.stderr
    assert "$(" not in r.stderr and "`" not in r.stderr, r.stderr
    # Debian 12's lines after 10 MB of one line: not read (first 16 KiB, 200 lines).
    t0 = time.monotonic()
    r = print_python(tmp_path, "X" * 10_000_000 + "\n" + OS_RELEASES["debian12"], path=path)
    assert time.monotonic() - t0 < 20
    assert r.returncode == 0 and "Debian" not in r.stderr, r.stderr


def source(script: str, env: dict[str, str],
           timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Run SCRIPT in bash after sourcing provision.sh (its functions and settings only)."""
    return subprocess.run(["bash", "-c", f'set -euo pipefail; source "$1"; {script}', "bash",
                           str(PROVISION)], capture_output=True, text=True, env=env,
                          timeout=timeout, check=False)


@pytest.mark.parametrize(("release", "ubuntu"), [("ubuntu2204", True), ("ubuntu2404", True),
                                                 ("debian12", False), ("debian13", False),
                                                 ('ID=linuxmint\nID_LIKE="ubuntu debian"\n',
                                                  True)])
def test_ubuntu_and_its_derivatives_get_linux_modules_extra(tmp_path: Path, release: str,
                                                            ubuntu: bool) -> None:
    f = tmp_path / "os-release"
    f.write_text(OS_RELEASES.get(release, release))
    r = source("os_release; if is_ubuntu; then echo yes; else echo no; fi",
               {**os.environ, "LIGHTPIPE_OS_RELEASE": str(f)})
    assert r.returncode == 0, r.stderr
    assert r.stdout == ("yes\n" if ubuntu else "no\n")


# --- Grafana's apt source ---------------------------------------------------------------

@pytest.fixture
def apt_sandbox(tmp_path: Path) -> dict[str, str]:
    """Environment for provision.sh's Grafana functions with every apt path in TMP: the key
    and source (LIGHTPIPE_APT_ETC), apt-get's lists, cache and lock (APT_CONFIG)."""
    etc = tmp_path / "etc-apt"
    (etc / "sources.list.d").mkdir(parents=True)
    (etc / "keyrings").mkdir()
    state = tmp_path / "apt-state"
    for d in ("lists/partial", "cache/archives/partial"):
        (state / d).mkdir(parents=True)
    conf = tmp_path / "apt.conf"
    conf.write_text(f'Dir::State::Lists "{state}/lists";\nDir::Cache "{state}/cache";\n'
                    'Debug::NoLocking "true";\nAPT::Sandbox::User "root";\n')
    home = tmp_path / "gnupg-provision"  # (gpg --dearmor's, not ~/.gnupg)
    home.mkdir(mode=0o700)
    return {**os.environ, "LIGHTPIPE_APT_ETC": str(etc), "APT_CONFIG": str(conf),
            "GNUPGHOME": str(home), "LANG": "C.UTF-8"}


def stale_source(env: dict[str, str]) -> Path:
    """Grafana's source and key as an earlier run left them."""
    etc = Path(env["LIGHTPIPE_APT_ETC"])
    (etc / "keyrings" / "grafana.gpg").write_bytes(b"an old key")
    lst = etc / "sources.list.d" / "grafana.list"
    lst.write_text(f"deb [signed-by={etc}/keyrings/grafana.gpg] https://apt.grafana.com "
                   "stable main\n")
    return lst


@pytest.fixture
def closed_port() -> Iterator[int]:
    """A local port bound but not listening: every connection to it is refused."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    try:
        yield s.getsockname()[1]
    finally:
        s.close()


class Served:
    """A directory served over HTTP on 127.0.0.1 (threads; stopped by the fixture)."""

    def __init__(self, root: Path) -> None:
        root.mkdir(parents=True, exist_ok=True)
        handler = type("Quiet", (http.server.SimpleHTTPRequestHandler,),
                       {"log_message": lambda *a: None})
        self.root = root
        self.server = http.server.ThreadingHTTPServer(
            ("127.0.0.1", 0), lambda *a: handler(*a, directory=str(root)))
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Served]:
    s = Served(tmp_path / "www")
    try:
        yield s
    finally:
        s.server.shutdown()
        s.server.server_close()


GRAFANA = ('rc=0; grafana_repo || rc=$?; echo "rc=$rc"; echo "why=$GRAFANA_REPO"; '
           'ARGS=(--repo /lightpipe --listen 0.0.0.0); REPO=/lightpipe; '
           '[ "$rc" = 0 ] || grafana_unreachable_line')


def test_grafana_unreachable_removes_its_source_in_one_line(apt_sandbox: dict[str, str],
                                                           closed_port: int) -> None:
    """The key was fetched by an earlier run, now the repository does not answer: the
    source goes (else every later apt-get update waits on it), and one line says so, what
    still works and what to run later (with this run's own flags)."""
    lst = stale_source(apt_sandbox)
    t0 = time.monotonic()
    r = source(GRAFANA, {**apt_sandbox, "LIGHTPIPE_GRAFANA_APT": f"http://127.0.0.1:{closed_port}"})
    assert time.monotonic() - t0 < 15
    assert r.returncode == 0, r.stderr
    assert "rc=1\n" in r.stdout and "why=curl: (7)" in r.stdout, r.stdout
    assert not lst.exists()
    lines = r.stderr.splitlines()
    assert len(lines) == 1, r.stderr
    line = lines[0]
    # (tests/vm/user_path.sh counts the lines that begin so: keep the start.)
    assert line.startswith(f"provision: Grafana's apt repository http://127.0.0.1:{closed_port}"
                           " is unreachable or unusable (curl: (7)"), line
    for part in ("Grafana not installed, its apt source left out", "everything else continues",
                 "the monitor on :9090", "lightpipe grafana check", "lightpipe report",
                 "vagrant provision", "sudo /lightpipe/vagrant/provision.sh --repo /lightpipe "
                 "--listen 0.0.0.0", "--no-grafana"):
        assert part in line, (part, line)


def test_grafana_key_that_is_no_key(apt_sandbox: dict[str, str], served: Served) -> None:
    """Something answers (a captive portal, a proxy's page) but not with a key."""
    (served.root / "gpg.key").write_text("<html>please log in</html>\n")
    lst = stale_source(apt_sandbox)
    r = source(GRAFANA, {**apt_sandbox, "LIGHTPIPE_GRAFANA_APT": served.url})
    assert r.returncode == 0, r.stderr
    assert "rc=1\n" in r.stdout and "why=its gpg.key is not a key: gpg: no valid OpenPGP data" \
        in r.stdout, r.stdout
    assert not lst.exists()
    assert (Path(apt_sandbox["LIGHTPIPE_APT_ETC"]) / "keyrings/grafana.gpg").read_bytes() \
        == b"an old key"  # (not overwritten by a failed dearmor)


@pytest.fixture
def gpg_homes(tmp_path: Path) -> Iterator[list[Path]]:
    """GnuPG homes a test makes; their gpg-agents (started by key generation) are ended."""
    homes: list[Path] = []
    try:
        yield homes
    finally:
        for home in homes:
            subprocess.run(["gpgconf", "--kill", "all"], env={**os.environ, "GNUPGHOME":
                           str(home)}, capture_output=True, timeout=30, check=False)


def gpg_repo(home: Path, root: Path) -> None:
    """A signed, empty apt repository (suite stable, component main) in ROOT, its armored
    key as ROOT/gpg.key, the key made in the GnuPG home HOME."""
    home.mkdir(mode=0o700)
    env = {**os.environ, "GNUPGHOME": str(home)}

    def gpg(*args: str) -> None:
        subprocess.run(["gpg", "--batch", "--quiet", "--yes", *args], env=env, check=True,
                       capture_output=True, timeout=60)

    gpg("--passphrase", "", "--quick-gen-key", "LightPipe test <t@example.invalid>",
        "ed25519", "sign", "never")
    dists = root / "dists" / "stable"
    entries = []
    for arch in ("amd64", "all", "i386", "arm64"):
        (dists / "main" / f"binary-{arch}").mkdir(parents=True)
        (dists / "main" / f"binary-{arch}" / "Packages").write_bytes(b"")
        entries.append(f" {hashlib.sha256(b'').hexdigest()} 0 main/binary-{arch}/Packages")
    (dists / "Release").write_text(
        "Origin: test\nSuite: stable\nCodename: stable\nArchitectures: amd64 all i386 arm64\n"
        f"Components: main\nDate: {time.strftime('%a, %d %b %Y %H:%M:%S UTC', time.gmtime())}\n"
        "SHA256:\n" + "\n".join(entries) + "\n")
    gpg("--clearsign", "-o", str(dists / "InRelease"), str(dists / "Release"))
    gpg("--armor", "--export", "-o", str(root / "gpg.key"))


def test_grafana_source_kept_only_while_the_repository_works(
        tmp_path: Path, apt_sandbox: dict[str, str], served: Served,
        gpg_homes: list[Path]) -> None:
    """With real apt-get (sandboxed): a signed repository is added (its key dearmored, the
    source naming it), a second run changes nothing; a repository signed by another key
    than the one it serves, or one whose index is gone, is removed again, with apt's own
    error in the line."""
    if shutil.which("gpg") is None or shutil.which("apt-get") is None:
        pytest.skip("needs gpg and apt-get")
    etc = Path(apt_sandbox["LIGHTPIPE_APT_ETC"])
    lst = etc / "sources.list.d" / "grafana.list"
    gpg_homes.append(tmp_path / "gnupg1")
    gpg_repo(gpg_homes[-1], served.root)
    env = {**apt_sandbox, "LIGHTPIPE_GRAFANA_APT": served.url}
    r = source(GRAFANA, env)
    assert r.returncode == 0 and "rc=0\nwhy=ok\n" in r.stdout, r.stdout + r.stderr
    assert r.stderr == ""
    assert lst.read_text() == (f"deb [signed-by={etc}/keyrings/grafana.gpg] {served.url} "
                               "stable main\n")
    key = (etc / "keyrings" / "grafana.gpg").read_bytes()
    assert key and not key.startswith(b"-----BEGIN")  # dearmored
    before = {p: p.stat().st_mtime_ns for p in (lst, etc / "keyrings" / "grafana.gpg")}
    again = source(GRAFANA, env)
    assert "rc=0\nwhy=ok\n" in again.stdout, again.stdout + again.stderr
    assert {p: p.stat().st_mtime_ns for p in before} == before  # idempotent

    # Signed by another key than the one served (a rotated key, a tampered mirror).
    shutil.copy(served.root / "gpg.key", tmp_path / "first.key")
    shutil.rmtree(served.root / "dists")
    gpg_homes.append(tmp_path / "gnupg2")
    gpg_repo(gpg_homes[-1], served.root)
    shutil.copy(tmp_path / "first.key", served.root / "gpg.key")
    later = time.time() + 60  # (newer than apt's copy: else the server answers 304)
    for f in (served.root / "dists").rglob("*"):
        os.utime(f, (later, later))
    r = source(GRAFANA, env)
    assert "rc=1\n" in r.stdout and "why=apt-get update of it failed: E: " in r.stdout, r.stdout
    assert not lst.exists()
    assert len(r.stderr.splitlines()) == 1 and "apt-get update of it failed" in r.stderr

    # The index gone (the repository moved): removed too.
    shutil.rmtree(served.root / "dists")
    lst.write_text("stale\n")
    r = source(GRAFANA, env)
    assert "rc=1\n" in r.stdout and "apt-get update of it failed: E: " in r.stdout, r.stdout
    assert not lst.exists()
    # Nothing of this machine's apt touched: the lists went to the sandbox.
    lists = Path(apt_sandbox["APT_CONFIG"]).parent / "apt-state" / "lists"
    assert any(p.name.startswith("127.0.0.1") for p in lists.iterdir())
    real = Path("/var/lib/apt/lists")
    assert not real.is_dir() or not any(p.name.startswith("127.0.0.1") for p in real.iterdir())
