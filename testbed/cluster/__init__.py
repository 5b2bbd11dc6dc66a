"""Emulation across machines: cluster file, DC placement, VXLAN tunnels, SSH checks.

Modules: spec (the cluster file), place (DCs onto machines), tunnel (VXLAN per crossing
fibre), share (each machine's part of the plan), remote (SSH and the machine check), cli
(`lightpipe cluster`). Nothing is imported here, so that building the CLI's parser stays
fast.
"""
