"""The Vagrant testbed's files: `vagrant validate`, the Vagrantfile's box (debian/bookworm64
unless LP_BOX says otherwise) and what it asks of the box (no guest additions: rsync only),
shellcheck on every shell script, vagrant/provision.sh idempotent (run twice) where it can
run (root, apt), its run with Grafana's repository unreachable (one line, the rest done),
the `lightpipe` wrapper it installs in the VM, the monitor's unit, and Grafana's
provisioning as root's own files (issue 27, finding 13: not a link into the synced
checkout's owner's tree).

provision.sh's Python per release and its Grafana source, without root: tests/test_provision.py.
The whole user path (vagrant up, reload, a run, Grafana's queries) is tests/vm/user_path.sh."""

from __future__ import annotations

import os
import pwd
import secrets
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PROVISION = REPO / "vagrant" / "provision.sh"
# Every part that needs services, apt repositories or the network left out: what stays is
# the base packages (present here) and Grafana's provisioning files.
OFFLINE = ["--no-setup", "--no-grafana", "--no-prometheus", "--no-ovs", "--no-modules",
           "--no-services"]


def shell_scripts() -> list[Path]:
    """Every tracked file that is a shell script (*.sh or a sh/bash shebang)."""
    out = subprocess.run(["git", "ls-files", "--cached", "--others",
                          "--exclude-standard"], cwd=REPO, capture_output=True, text=True,
                         check=False).stdout.split()
    files = [REPO / f for f in out] if out else [p for p in REPO.rglob("*") if ".venv"
                                                 not in p.parts and ".git" not in p.parts]
    found = []
    for p in files:
        if not p.is_file():
            continue
        if p.suffix == ".sh":
            found.append(p)
            continue
        try:
            first = p.open("rb").readline(200)
        except OSError:
            continue
        if first.startswith(b"#!") and (b"bash" in first or first.rstrip().endswith(b"/sh")):
            found.append(p)
    return sorted(set(found))


def test_every_shell_script_is_shellcheck_clean() -> None:
    if shutil.which("shellcheck") is None:
        pytest.skip("shellcheck not installed (scripts/setup.sh installs it as root)")
    scripts = shell_scripts()
    names = {str(p.relative_to(REPO)) for p in scripts}
    assert {"vagrant/provision.sh", "tests/vm/run.sh", "scripts/setup.sh"} <= names, names
    r = subprocess.run(["shellcheck", "-x", *map(str, scripts)], cwd=REPO,
                       capture_output=True, text=True, check=False)
    assert r.returncode == 0, r.stdout[-3000:]


def test_vagrant_validate() -> None:
    if shutil.which("vagrant") is None:
        pytest.skip("vagrant not installed (.ci/run installs vagrant and vagrant-libvirt)")
    env = {**os.environ, "VAGRANT_CHECKPOINT_DISABLE": "1", "LP_CPUS": "2",
           "LP_MEMORY_MB": "4096"}
    r = subprocess.run(["vagrant", "validate"], cwd=REPO / "vagrant", capture_output=True,
                       text=True, check=False, env=env, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "validated successfully" in r.stdout
    bad = subprocess.run(["vagrant", "validate"], cwd=REPO / "vagrant", capture_output=True,
                         text=True, check=False, env={**env, "LP_CPUS": "many"}, timeout=300)
    assert bad.returncode != 0  # CPUs from the environment are parsed, not passed blindly


# The Vagrantfile evaluated by Ruby with a stand-in for Vagrant's configuration objects that
# records every setting (no Vagrant, box or provider needed): what it asks for, per environment.
RECORD_VAGRANTFILE = r"""
require "json"
$log = []
class Rec
  def initialize(path) @path = path end
  def method_missing(name, *args, **kw, &blk)
    n = name.to_s
    if n.end_with?("=")
      $log << [@path + "." + n.chomp("="), args[0]]
      return args[0]
    end
    return Rec.new(@path + "." + n) if args.empty? && kw.empty? && blk.nil?
    $log << [@path + "." + n, args, kw]
    blk.call(Rec.new(@path + "." + n + "." + args[0].to_s), Rec.new("override")) if blk
    nil
  end
  def respond_to_missing?(*) true end
end
module Vagrant
  def self.has_plugin?(name) ENV.fetch("FAKE_PLUGINS", "").split(",").include?(name) end
  def self.configure(_version) yield Rec.new("config") end
end
load ARGV[0]
puts JSON.generate($log)
"""


def vagrantfile_settings(env: dict[str, str]) -> list[list[object]]:
    if shutil.which("ruby") is None:
        pytest.skip("ruby not installed (vagrant brings it)")
    r = subprocess.run(["ruby", "-e", RECORD_VAGRANTFILE, str(REPO / "vagrant" / "Vagrantfile")],
                       capture_output=True, text=True, check=False, timeout=60,
                       env={**{k: v for k, v in os.environ.items() if not k.startswith("LP_")},
                            **env})
    assert r.returncode == 0, r.stderr
    import json

    return json.loads(r.stdout)


def test_vagrantfile_default_box_is_debian_bookworm() -> None:
    """debian/bookworm64 (Debian 12, Python 3.11: the release CI's box is built from), unless
    LP_BOX names another (empty counts as unset)."""
    for env, box in [({}, "debian/bookworm64"), ({"LP_BOX": ""}, "debian/bookworm64"),
                     ({"LP_BOX": " "}, "debian/bookworm64"),
                     ({"LP_BOX": "bento/ubuntu-24.04"}, "bento/ubuntu-24.04")]:
        got = [e[1] for e in vagrantfile_settings(env) if e[0] == "config.vm.box"]
        assert got == [box], (env, got)
    assert 'DEFAULT_BOX = "debian/bookworm64"' in (REPO / "vagrant" / "Vagrantfile").read_text()


def test_vagrantfile_needs_no_guest_additions() -> None:
    """Debian's boxes have no VirtualBox guest additions: every synced folder is rsync or
    off, VirtualBox does not look for the additions, and the vagrant-vbguest plugin (where
    installed) does not try to build them."""
    log = vagrantfile_settings({})
    folders = [e for e in log if e[0] == "config.vm.synced_folder"]
    assert folders, log
    for _, args, kw in folders:
        assert kw.get("type") == "rsync" or kw.get("disabled") is True, (args, kw)
    assert ["config.vm.provider.virtualbox.check_guest_additions", False] in log
    assert not any(str(e[0]).startswith("config.vbguest") for e in log)
    with_plugin = vagrantfile_settings({"FAKE_PLUGINS": "vagrant-vbguest"})
    assert ["config.vbguest.auto_update", False] in with_plugin


def test_cluster_vagrantfile_validates_and_makes_its_key_once(tmp_path: Path) -> None:
    """vagrant/cluster/Vagrantfile (two guests, tests/vm/cluster.sh): valid, and the SSH key
    pair between the guests is made once, private to its owner, then reused."""
    if shutil.which("vagrant") is None or shutil.which("ssh-keygen") is None:
        pytest.skip("vagrant or ssh-keygen not installed")
    keys = tmp_path / "keys"
    env = {**os.environ, "VAGRANT_CHECKPOINT_DISABLE": "1", "LP_CLUSTER_KEYS": str(keys)}
    runs = []
    for _ in range(2):
        r = subprocess.run(["vagrant", "validate"], cwd=REPO / "vagrant" / "cluster",
                           capture_output=True, text=True, check=False, env=env, timeout=300)
        assert r.returncode == 0 and "validated successfully" in r.stdout, r.stdout + r.stderr
        runs.append((keys / "id_ed25519").read_bytes())
    assert runs[0] == runs[1]  # made once
    assert (keys / "id_ed25519").stat().st_mode & 0o077 == 0
    assert (keys / "id_ed25519.pub").read_text().startswith("ssh-ed25519 ")


@pytest.mark.root
@pytest.mark.slow
def test_provision_twice_is_idempotent() -> None:
    """Where it can run (root, apt): twice in a row, both succeed; the second installs
    nothing. Grafana's repository and `make setup` are left out (no network to Grafana
    here; CI runs make setup itself)."""
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        pytest.skip("needs root and apt-get")
    argv = ["bash", str(PROVISION), "--no-grafana", "--no-setup", "--repo", str(REPO)]
    with tempfile.TemporaryDirectory(prefix="lp-prov-") as etc:
        env = {**os.environ, "LIGHTPIPE_GRAFANA_ETC": f"{etc}/grafana"}
        first = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=900,
                               env=env)
        assert first.returncode == 0, first.stderr[-2000:]
        assert "Grafana provisioning in" in first.stderr
        second = subprocess.run(argv, capture_output=True, text=True, check=False,
                                timeout=900, env=env)
    assert second.returncode == 0, second.stderr[-2000:]
    assert "installing" not in second.stderr, second.stderr
    assert "Grafana provisioning in" not in second.stderr, second.stderr  # nothing rewritten
    assert "provision: done" in second.stderr


@pytest.mark.root
def test_provision_with_grafana_unreachable_says_so_once_and_finishes(tmp_path: Path) -> None:
    """Grafana's repository unreachable (a closed local port) and its source left by an
    earlier run: provision.sh removes the source before any apt-get update (which it would
    slow or fail), says so in one line, and finishes. The source and key live in a temporary
    directory (LIGHTPIPE_APT_ETC), never this machine's /etc/apt."""
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        pytest.skip("needs root and apt-get")
    etc = tmp_path / "etc-apt"
    (etc / "sources.list.d").mkdir(parents=True)
    (etc / "keyrings").mkdir()
    (etc / "keyrings" / "grafana.gpg").write_bytes(b"an old key")
    lst = etc / "sources.list.d" / "grafana.list"
    lst.write_text(f"deb [signed-by={etc}/keyrings/grafana.gpg] https://apt.grafana.com "
                   "stable main\n")
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))  # bound, not listening: connections are refused
    try:
        env = {**os.environ, "LIGHTPIPE_GRAFANA_ETC": str(tmp_path / "grafana"),
               "LIGHTPIPE_APT_ETC": str(etc), "GNUPGHOME": str(tmp_path),
               "LIGHTPIPE_GRAFANA_APT": f"http://127.0.0.1:{closed.getsockname()[1]}"}
        offline = [a for a in OFFLINE if a != "--no-grafana"]
        r = subprocess.run(["bash", str(PROVISION), "--repo", str(REPO), *offline],
                           capture_output=True, text=True, timeout=600, env=env, check=False)
    finally:
        closed.close()
    assert r.returncode == 0, r.stderr[-2000:]
    assert not lst.exists()
    grafana = [ln for ln in r.stderr.splitlines() if "Grafana not installed" in ln]
    assert len(grafana) == 1, r.stderr
    # The start tests/vm/user_path.sh counts (once) in a real `vagrant up`.
    assert grafana[0].startswith("provision: Grafana's apt repository http://127.0.0.1:")
    assert sum(ln.startswith("provision: Grafana's apt repository")
               for ln in r.stderr.splitlines()) == 1
    assert "unreachable or unusable (curl: (7)" in grafana[0]
    assert f"sudo {REPO}/vagrant/provision.sh --repo {REPO} --no-setup" in grafana[0]
    assert "Grafana provisioning in" in r.stderr  # (ready for a later Grafana)
    assert r.stderr.splitlines()[-1] == "provision: done"


@pytest.mark.root
@pytest.mark.parametrize(("release", "calls"), [
    ('ID=ubuntu\nVERSION_ID="22.04"\nVERSION_CODENAME=jammy\nID_LIKE=debian\n', [
        "apt-get -o DPkg::Lock::Timeout=300 update -qq",
        "apt-cache policy python3.11",
        "apt-get -o DPkg::Lock::Timeout=300 -y -q --no-install-recommends install python3.11 "
        "python3.11-venv",
        "apt-cache policy linux-modules-extra-5.15.0-100-generic",
        "apt-get -o DPkg::Lock::Timeout=300 -y -q --no-install-recommends install "
        "linux-modules-extra-5.15.0-100-generic",
        "make -C {repo} setup PYTHON=python3.11"]),
    ('ID=debian\nVERSION_ID="12"\nVERSION_CODENAME=bookworm\n', [
        "make -C {repo} setup PYTHON=python3"]),
])
def test_provision_passes_the_release_python_to_make_setup(tmp_path: Path, release: str,
                                                           calls: list[str]) -> None:
    """The whole script for a release, its tools faked (apt-get, apt-cache, dpkg-query,
    make, modprobe, uname: each call logged; only python3.11*, linux-modules-extra-* "not
    installed"), in a mount namespace of its own where /usr/local/bin and
    /etc/modules-load.d are scratch directories: Ubuntu 22.04 gets python3.11 from its
    archive and `make setup PYTHON=python3.11`, Debian 12 `PYTHON=python3`."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare (a private mount namespace)")
    fake, log = tmp_path / "fake", tmp_path / "calls"
    fake.mkdir()
    tools = {
        "apt-get": f'echo "apt-get $*" >> {log}',
        "apt-cache": f'echo "apt-cache $*" >> {log}\n'
                     'case "$2" in python3.11|linux-modules-extra-*) echo "  Candidate: 1";; esac',
        "dpkg-query": 'for a; do p=$a; done\n'
                      'case "$p" in python3.11*|linux-modules-extra-*) exit 1;; esac\n'
                      "printf 'install ok installed'",
        "make": f'echo "make $*" >> {log}',
        "modprobe": "exit 0",
        "uname": "echo 5.15.0-100-generic",
    }
    for name, body in tools.items():
        (fake / name).write_text(f"#!/bin/sh\n{body}\n")
        (fake / name).chmod(0o755)
    for d in ("localbin", "modules-load.d"):
        (tmp_path / d).mkdir()
    (tmp_path / "os-release").write_text(release)
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    env = {**os.environ, "PATH": f"{fake}:{os.environ['PATH']}",
           "LIGHTPIPE_OS_RELEASE": str(tmp_path / "os-release"),
           "LIGHTPIPE_GRAFANA_ETC": str(tmp_path / "grafana"),
           "LIGHTPIPE_APT_ETC": str(tmp_path / "apt"), "GNUPGHOME": str(tmp_path),
           "LIGHTPIPE_GRAFANA_APT": f"http://127.0.0.1:{closed.getsockname()[1]}"}
    script = (f"mount --bind {tmp_path}/localbin /usr/local/bin && "
              f"mount --bind {tmp_path}/modules-load.d /etc/modules-load.d && "
              f'exec bash {PROVISION} --repo {REPO} --no-services --no-prometheus --no-ovs')
    try:
        r = subprocess.run(["unshare", "-m", "--propagation", "private", "bash", "-c", script],
                           capture_output=True, text=True, timeout=300, env=env, check=False)
    finally:
        closed.close()
    assert r.returncode == 0, r.stderr[-2000:]
    assert log.read_text().splitlines() == [c.format(repo=REPO) for c in calls]
    assert (tmp_path / "localbin" / "lightpipe").is_file()  # (the wrapper, in the scratch)
    assert r.stderr.splitlines()[-1] == "provision: done"


def test_provision_rejects_unknown_flags() -> None:
    r = subprocess.run(["bash", str(PROVISION), "--no-such-flag"],
                       capture_output=True, text=True, check=False)
    assert r.returncode == 2 and "unknown option --no-such-flag" in r.stderr
    r = subprocess.run(["bash", str(PROVISION), "--listen", "10.0.0.1"],
                       capture_output=True, text=True, check=False)
    assert r.returncode == 2 and "--listen 10.0.0.1: 127.0.0.1 or 0.0.0.0" in r.stderr


def test_vagrantfile_forwards_to_loopback_only() -> None:
    """Both forwards bind the host's 127.0.0.1; on libvirt (SSH tunnels into the guest) they
    reach the guest's own loopback, where provision.sh --listen 127.0.0.1 binds the services;
    VirtualBox's NAT needs the guest to listen on its NIC (--listen 0.0.0.0)."""
    import re

    text = re.sub(r",\s*\n\s*", ", ", (REPO / "vagrant" / "Vagrantfile").read_text())
    fwd = [ln.strip() for ln in text.splitlines() if '"forwarded_port"' in ln]
    assert len(fwd) == 4 and all('host_ip: "127.0.0.1"' in ln for ln in fwd), fwd
    assert text.count('guest_ip: "127.0.0.1"') == 2
    assert 'args: provision_args + ["--listen", "127.0.0.1"]' in text
    assert 'args: provision_args + ["--listen", "0.0.0.0"]' in text


def test_monitor_unit_runs_the_monitor_in_the_foreground() -> None:
    """The unit's ExecStart is a command line the CLI accepts, on the datasource's port."""
    unit = (REPO / "vagrant" / "lightpipe-monitor.service").read_text()
    keys = dict(ln.split("=", 1) for ln in unit.splitlines() if "=" in ln and ln[0] != "#")
    assert keys["Type"] == "exec" and keys["Restart"] == "on-failure"
    assert keys["StateDirectory"] == "lightpipe" and keys["WantedBy"] == "multi-user.target"
    argv = keys["ExecStart"].replace("@REPO@", str(REPO)).replace("@PORT@", "9090") \
        .replace("@LISTEN@", "127.0.0.1").split()
    assert argv[:5] == [f"{REPO}/.venv/bin/lightpipe", "monitor", "up", "--foreground",
                        "--port"] and argv[5] == "9090"
    import yaml

    ds = yaml.safe_load((REPO / "grafana/provisioning/datasources/lightpipe.yaml").read_text())
    assert ds["datasources"][0]["url"] == "http://127.0.0.1:9090"
    from testbed.cli.main import build_parser

    args = build_parser().parse_args(argv[1:])
    assert args.foreground and args.port == 9090 and args.listen == "127.0.0.1"


def _wrapper(tmp: Path) -> Path:
    """vagrant/lightpipe-wrapper.sh as provision.sh installs it, for this checkout."""
    text = (REPO / "vagrant" / "lightpipe-wrapper.sh").read_text()
    w = tmp / "lightpipe"
    w.write_text(text.replace("@REPO@", str(REPO)).replace("@STATE@", str(tmp / "state")))
    w.chmod(0o755)
    return w


@pytest.mark.root
def test_wrapper_runs_a_scenario_from_anywhere_without_out(tmp_path: Path) -> None:
    """`lightpipe run scenarios/X.yaml` from another directory: the scenario is the
    checkout's, the run goes to STATE/runs/X-TIME, and subcommands named like the
    checkout's directories (grafana) are left alone."""
    if os.geteuid() != 0:
        pytest.skip("the wrapper runs the CLI as root (sudo otherwise)")
    if not (REPO / ".venv" / "bin" / "lightpipe").exists():
        pytest.skip("needs make setup")
    w = _wrapper(tmp_path)
    cwd = tmp_path / "elsewhere"
    cwd.mkdir()
    r = subprocess.run([str(w), "run", "--backend", "sim", "scenarios/monitor-demo.yaml",
                        "-q"], cwd=cwd, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    runs = list((tmp_path / "state" / "runs").iterdir())
    assert len(runs) == 1 and runs[0].name.startswith("monitor-demo-"), runs
    assert f"no --out: writing to {runs[0]}" in r.stderr
    assert (runs[0] / "summary.json").is_file()
    assert not list(cwd.iterdir())
    g = subprocess.run([str(w), "grafana", "build", "--check"], cwd=cwd, capture_output=True,
                       text=True, timeout=120)
    assert g.returncode == 0, g.stderr
    # A file that exists where the user is wins over the checkout's.
    (cwd / "scenarios").mkdir()
    (cwd / "scenarios" / "monitor-demo.yaml").write_text("version: 1\nname: [broken\n")
    v = subprocess.run([str(w), "validate", "scenarios/monitor-demo.yaml"], cwd=cwd,
                       capture_output=True, text=True, timeout=120)
    assert v.returncode == 2, v.stdout + v.stderr


@pytest.fixture
def rsync_user() -> Iterator[tuple[str, int]]:
    """A throw-away local user: in the VM, the owner of the synced checkout (vagrant)."""
    name = f"lpv{secrets.token_hex(3)}"
    subprocess.run(["useradd", "-m", "-s", "/bin/sh", name], check=True)
    try:
        yield name, pwd.getpwnam(name).pw_uid
    finally:
        subprocess.run(["userdel", "-r", name], capture_output=True, check=False)


@pytest.mark.root
def test_grafana_provisioning_is_roots_not_the_checkout_owners(
        rsync_user: tuple[str, int]) -> None:
    """Issue 27, finding 13: /etc/grafana/provisioning was a link into the synced checkout,
    whose owner could then point Grafana's datasource anywhere and load any dashboard. The
    attack: provisioning left as the old provision.sh made it (the link), provision.sh runs,
    then the checkout's owner edits their datasource file. Grafana's must stay root's copy,
    with the dashboards' path written in and no variable to set."""
    if os.geteuid() != 0 or shutil.which("useradd") is None or shutil.which("apt-get") is None:
        pytest.skip("needs root, useradd and apt-get")
    user, uid = rsync_user
    base = Path(tempfile.mkdtemp(prefix="lp-grafana-", dir="/var/tmp"))
    try:
        base.chmod(0o755)
        repo = base / "checkout"
        (repo / "grafana").mkdir(parents=True)
        shutil.copy(REPO / "Makefile", repo / "Makefile")
        shutil.copytree(REPO / "grafana" / "provisioning", repo / "grafana" / "provisioning")
        shutil.copytree(REPO / "grafana" / "dashboards", repo / "grafana" / "dashboards")
        subprocess.run(["chown", "-R", f"{user}:", str(repo)], check=True)
        etc = base / "etc" / "grafana"
        etc.mkdir(parents=True)
        (etc / "provisioning").symlink_to(repo / "grafana" / "provisioning")  # the old way
        env = {**os.environ, "LIGHTPIPE_GRAFANA_ETC": str(etc)}
        r = subprocess.run(["bash", str(PROVISION), "--repo", str(repo), *OFFLINE],
                           capture_output=True, text=True, timeout=600, env=env, check=False)
        assert r.returncode == 0, r.stderr[-2000:]
        ds = etc / "provisioning" / "datasources" / "lightpipe.yaml"
        before = ds.read_text()
        # The attack: the checkout's owner rewrites what they own.
        mine = repo / "grafana" / "provisioning" / "datasources" / "lightpipe.yaml"
        evil = before.replace("http://127.0.0.1:9090", "http://198.51.100.7:9090")
        w = subprocess.run(["runuser", "-u", user, "--", "sh", "-c",
                            f"printf '%s' \"$1\" > {mine}", "sh", evil],
                           capture_output=True, text=True, timeout=60, check=False)
        assert w.returncode == 0, w.stderr
        assert ds.read_text() == before and "198.51.100.7" not in before
        # ... or writes Grafana's files directly.
        for target in (ds, etc / "dashboards" / "lightpipe" / "overview.json"):
            t = subprocess.run(["runuser", "-u", user, "--", "sh", "-c", f"echo x >> {target}"],
                               capture_output=True, text=True, timeout=60, check=False)
            assert t.returncode != 0, f"{user} could write {target}"
        # Everything Grafana reads is root's and lies outside the checkout.
        for p in [etc / "provisioning", *sorted((etc / "provisioning").rglob("*")),
                  *sorted((etc / "dashboards").rglob("*"))]:
            assert not p.is_symlink(), p
            st = p.lstat()
            assert st.st_uid == 0 and not st.st_mode & 0o022, p
            assert not str(p.resolve()).startswith(str(repo)), p
        import yaml

        prov = yaml.safe_load((etc / "provisioning/dashboards/lightpipe.yaml").read_text())
        path = Path(prov["providers"][0]["options"]["path"])
        assert path == etc / "dashboards" / "lightpipe"
        assert sorted(p.name for p in path.glob("*.json")) == sorted(
            p.name for p in (REPO / "grafana" / "dashboards").glob("*.json"))
        assert "${" not in (etc / "provisioning/dashboards/lightpipe.yaml").read_text()
        assert uid != 0
    finally:
        shutil.rmtree(base, ignore_errors=True)
