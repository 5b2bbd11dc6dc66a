"""Validation of names that may reach interface names, file names, shells or netlink."""

from __future__ import annotations

import re

# DC names end up in host names, metric labels and (prefixed) interface names.
DC_NAME_RE = re.compile(r"^[a-z][a-z0-9-]{0,14}$")
# Topology node ids: free text is not allowed, they appear in CSV rows and labels.
NODE_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,31}$")
# Scenario and job names end up in directory names and labels.
SCENARIO_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
# Names of catalogue entries (models, GPU types) and registry keys.
KEY_RE = re.compile(r"^[a-z0-9][a-z0-9_.+-]{0,47}$")
# Linux interface names are at most 15 bytes; we keep to a safe alphabet.
IFNAME_RE = re.compile(r"^[a-zA-Z][a-zA-Z0-9_-]{0,14}$")


def check(regex: re.Pattern[str], value: str, what: str) -> str:
    """Return value if it matches regex, else raise ValueError naming what is allowed."""
    if not isinstance(value, str) or not regex.fullmatch(value):
        raise ValueError(f"unsafe {what} {value!r} (allowed: {describe(regex)})")
    return value


def describe(regex: re.Pattern[str]) -> str:
    return {
        DC_NAME_RE: "lowercase letter, then up to 14 of a-z 0-9 -",
        NODE_NAME_RE: "letter or digit, then up to 31 of A-Z a-z 0-9 _ . -",
        SCENARIO_NAME_RE: "letter or digit, then up to 63 of A-Z a-z 0-9 _ . -",
        KEY_RE: "lowercase letter or digit, then up to 47 of a-z 0-9 _ . + -",
        IFNAME_RE: "letter, then up to 14 of A-Z a-z 0-9 _ -",
    }.get(regex, regex.pattern)


def check_ifname(value: str) -> str:
    """Validate a network interface name before it reaches netlink or a shell."""
    return check(IFNAME_RE, value, "interface name")
