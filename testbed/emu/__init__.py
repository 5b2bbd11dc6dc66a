"""Emulation backend internals: plan, private OVS, link emulators, network lifecycle, probes."""
