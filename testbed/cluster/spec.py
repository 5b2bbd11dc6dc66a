"""The cluster file: the machines an emulation spans, how to reach them over SSH, tunnels.

Every value that reaches a shell, an SSH command line or netlink is checked here: machine
names (testbed.names), user names, addresses (an IP literal or a host name that cannot
be read as an ssh option), absolute paths in a safe alphabet. Relative key and
known_hosts paths are taken beside the cluster file. Errors are one line naming the field
(SpecError, exit code 2), as for scenario files.
"""

from __future__ import annotations

import ipaddress
import re
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, ValidationError, field_validator, model_validator

from testbed import names
from testbed.errors import InputError, SpecError
from testbed.io.bounded import SPEC_MAX_BYTES, read_bounded_text
from testbed.spec.load import format_validation_error, parse_yaml
from testbed.spec.models import Frozen

# POSIX portable user names (useradd's default rule).
USER_RE = re.compile(r"^[a-z_][a-z0-9_-]{0,31}$")
# A DNS host name (RFC 1123 labels); never starts with '-', so ssh cannot read it as an option.
HOSTNAME_RE = re.compile(r"^(?=.{1,253}$)[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
                         r"(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$")
# Paths that reach a remote shell (quoted anyway) or ssh's -i: a safe alphabet only.
PATH_RE = re.compile(r"^[A-Za-z0-9_./~+-]{1,4096}$")

DEFAULT_VXLAN_PORT = 4789  # IANA's VXLAN port


def _check_address(value: str, what: str) -> str:
    try:
        return str(ipaddress.ip_address(value))
    except ValueError:
        pass
    if not HOSTNAME_RE.fullmatch(value):
        raise ValueError(f"unsafe {what} {value!r} (an IP address or a host name: "
                         "letters, digits, '-' and '.', not starting with '-')")
    return value


def _check_ip(value: str, what: str) -> str:
    try:
        return str(ipaddress.ip_address(value))
    except ValueError:
        raise ValueError(f"{what} must be an IP address (got {value!r})") from None


def _check_path(value: str, what: str) -> str:
    if not PATH_RE.fullmatch(value) or ".." in Path(value).parts:
        raise ValueError(f"unsafe {what} {value!r} (letters, digits and _ . / ~ + -, no '..')")
    return value


class SshSpec(Frozen):
    """How to reach the machines: defaults that each machine may override."""

    user: str = "root"
    key: str | None = Field(default=None, description="private key file (relative: beside "
                            "the cluster file); none: ssh's own defaults and agent")
    port: Annotated[int, Field(ge=1, le=65535)] = 22
    host_key_checking: Literal["strict", "accept-new"] = Field(
        default="strict", description="strict: the machine's key must already be in "
        "known_hosts; accept-new: trust a first key, refuse a changed one (never 'no')")
    known_hosts: str | None = Field(default=None, description="known_hosts file (relative: "
                                    "beside the cluster file); none: ~/.ssh/known_hosts")
    connect_timeout_s: Annotated[int, Field(ge=1, le=120)] = 10

    @field_validator("user")
    @classmethod
    def _user(cls, value: str) -> str:
        return names.check(USER_RE, value, "ssh user")

    @field_validator("key", "known_hosts")
    @classmethod
    def _path(cls, value: str | None) -> str | None:
        return None if value is None else _check_path(value, "path")


class TunnelSpec(Frozen):
    """How fibres that cross machines are carried (docs/cluster.md, "Tunnels")."""

    kind: Literal["vxlan"] = "vxlan"
    udp_port: Annotated[int, Field(ge=1, le=65535)] = DEFAULT_VXLAN_PORT
    underlay_mtu: Annotated[int, Field(ge=1280, le=65535)] = Field(
        default=1500, description="MTU of the network between the machines' tunnel "
        "addresses (9000 for jumbo frames); below the encapsulated frame's size the kernel "
        "fragments the outer packets")


class MachineSpec(Frozen):
    """One machine of the cluster."""

    name: str
    address: str = Field(description="where SSH reaches it: an IP address or host name")
    tunnel_address: str | None = Field(
        default=None, description="IP address the VXLAN tunnels use (a data network); "
        "default: address, which must then be an IP address")
    user: str | None = None
    key: str | None = None
    port: Annotated[int, Field(ge=1, le=65535)] | None = None
    venv: str | None = Field(default=None, description="LightPipe's virtual environment on "
                             "the machine (absolute); default: the cluster's venv")

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        return names.check(names.DC_NAME_RE, value, "machine name")

    @field_validator("address")
    @classmethod
    def _address(cls, value: str) -> str:
        return _check_address(value, "address")

    @field_validator("tunnel_address")
    @classmethod
    def _tunnel(cls, value: str | None) -> str | None:
        return None if value is None else _check_ip(value, "tunnel_address")

    @field_validator("user")
    @classmethod
    def _user(cls, value: str | None) -> str | None:
        return None if value is None else names.check(USER_RE, value, "ssh user")

    @field_validator("key")
    @classmethod
    def _key(cls, value: str | None) -> str | None:
        return None if value is None else _check_path(value, "path")

    @field_validator("venv")
    @classmethod
    def _venv(cls, value: str | None) -> str | None:
        return None if value is None else check_venv(value)

    @property
    def underlay_ip(self) -> str:
        """The address tunnels use (checked to be an IP by ClusterSpec)."""
        return self.tunnel_address or self.address


def check_venv(value: str) -> str:
    """The venv path when it is safe and absolute (ValueError naming it otherwise)."""
    _check_path(value, "venv")
    if not value.startswith("/"):
        raise ValueError(f"venv must be an absolute path (got {value!r})")
    return value


class ClusterSpec(Frozen):
    """A cluster file: machines, SSH defaults, the venv path and the tunnels."""

    version: Literal[1] = 1
    name: str = "cluster"
    ssh: SshSpec = SshSpec()
    venv: str = Field(default="/lightpipe/.venv", description="LightPipe's virtual "
                      "environment on every machine (absolute; `make setup` makes it)")
    tunnel: TunnelSpec = TunnelSpec()
    machines: Annotated[list[MachineSpec], Field(min_length=1, max_length=64)]
    base_dir: str | None = Field(default=None, exclude=True,
                                 description="set by load_cluster: the file's directory")

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        return names.check(names.SCENARIO_NAME_RE, value, "cluster name")

    @field_validator("venv")
    @classmethod
    def _venv(cls, value: str) -> str:
        return check_venv(value)

    @model_validator(mode="after")
    def _unique(self) -> ClusterSpec:
        seen: dict[str, int] = {}
        for i, m in enumerate(self.machines):
            if m.name in seen:
                raise ValueError(f"machines[{i}].name: {m.name!r} is also machines"
                                 f"[{seen[m.name]}]'s name")
            seen[m.name] = i
        for field_name in ("address", "underlay_ip"):
            where: dict[str, int] = {}
            for i, m in enumerate(self.machines):
                value = getattr(m, field_name)
                if value in where:
                    label = "tunnel_address" if field_name == "underlay_ip" else field_name
                    raise ValueError(f"machines[{i}].{label}: {value} is also machines"
                                     f"[{where[value]}]'s")
                where[value] = i
        families = set()
        for i, m in enumerate(self.machines):
            try:
                families.add(ipaddress.ip_address(m.underlay_ip).version)
            except ValueError:
                raise ValueError(f"machines[{i}].tunnel_address: required when address "
                                 f"{m.address!r} is a host name (VXLAN needs an IP)") from None
        if len(families) > 1:
            raise ValueError("machines: tunnel addresses mix IPv4 and IPv6")
        return self

    def machine(self, name: str) -> MachineSpec:
        for m in self.machines:
            if m.name == name:
                return m
        raise KeyError(name)

    @property
    def machine_names(self) -> tuple[str, ...]:
        return tuple(m.name for m in self.machines)

    def user_of(self, m: MachineSpec) -> str:
        return m.user or self.ssh.user

    def port_of(self, m: MachineSpec) -> int:
        return m.port or self.ssh.port

    def venv_of(self, m: MachineSpec) -> str:
        return m.venv or self.venv

    def key_of(self, m: MachineSpec) -> Path | None:
        """The private key for machine m, resolved beside the cluster file."""
        return self._resolve(m.key or self.ssh.key)

    def known_hosts_path(self) -> Path | None:
        return self._resolve(self.ssh.known_hosts)

    def _resolve(self, value: str | None) -> Path | None:
        if value is None:
            return None
        p = Path(value).expanduser()
        if not p.is_absolute() and self.base_dir is not None:
            p = Path(self.base_dir) / p
        return p

    def underlay_version(self) -> int:
        return ipaddress.ip_address(self.machines[0].underlay_ip).version


def parse_cluster(data: Any, base_dir: Path | None = None,
                  source: str | None = None) -> ClusterSpec:
    """Validate a decoded cluster file (a mapping) into a ClusterSpec (SpecError)."""
    if not isinstance(data, dict):
        raise SpecError("(root)", "expected a mapping with a `machines` list", source=source)
    if "base_dir" in data:
        raise SpecError("base_dir", "unknown key", source=source)
    try:
        spec = ClusterSpec.model_validate(data)
    except ValidationError as exc:
        path, message = format_validation_error(exc)
        # Cross-field errors name their own field: "machines[1].name: ..."
        if path == "(root)" and re.match(r"^[a-z_]+(\[\d+\])?(\.[a-z_]+)?: ", message):
            path, message = message.split(": ", 1)
        raise SpecError(path, message, source=source) from None
    if base_dir is not None:
        spec = spec.model_copy(update={"base_dir": str(base_dir)})
    return spec


def load_cluster(path: str | Path) -> ClusterSpec:
    """Read and validate a cluster file (YAML); relative key paths are beside it."""
    p = Path(path)
    if not p.is_file():
        raise InputError("--cluster", f"{p}: no such file")
    try:
        text = read_bounded_text(p, "--cluster", SPEC_MAX_BYTES)
    except InputError as exc:
        raise SpecError("", exc.message, source=str(p)) from None
    return parse_cluster(parse_yaml(text, source=str(p)), p.resolve().parent, str(p))
