"""Import shim: the Ryu app API from os-ken (maintained fork), or from Ryu where it runs."""

from __future__ import annotations

try:  # os-ken 4.x
    from os_ken.base import app_manager
    from os_ken.controller import ofp_event
    from os_ken.controller.handler import (
        CONFIG_DISPATCHER,
        DEAD_DISPATCHER,
        MAIN_DISPATCHER,
        set_ev_cls,
    )
    from os_ken.lib import hub
    from os_ken.lib.packet import arp, ethernet, packet
    from os_ken.ofproto import ofproto_v1_3

    BaseApp = app_manager.OSKenApp
    FRAMEWORK = "os_ken"
except ImportError:  # pragma: no cover - Ryu on an older Python
    from ryu.base import app_manager  # type: ignore[no-redef]
    from ryu.controller import ofp_event  # type: ignore[no-redef]
    from ryu.controller.handler import (  # type: ignore[no-redef]
        CONFIG_DISPATCHER,
        DEAD_DISPATCHER,
        MAIN_DISPATCHER,
        set_ev_cls,
    )
    from ryu.lib import hub  # type: ignore[no-redef]
    from ryu.lib.packet import arp, ethernet, packet  # type: ignore[no-redef]
    from ryu.ofproto import ofproto_v1_3  # type: ignore[no-redef]

    BaseApp = app_manager.RyuApp
    FRAMEWORK = "ryu"

__all__ = [
    "CONFIG_DISPATCHER",
    "DEAD_DISPATCHER",
    "FRAMEWORK",
    "MAIN_DISPATCHER",
    "BaseApp",
    "app_manager",
    "arp",
    "ethernet",
    "hub",
    "ofp_event",
    "ofproto_v1_3",
    "packet",
    "set_ev_cls",
]
