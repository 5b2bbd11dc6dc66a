"""Emulation across machines: cluster file, DC placement, VXLAN tunnels, SSH checks.

Modules: spec (the cluster file), place (DCs onto machines), tunnel (VXLAN per crossing
fibre), share (each machine's part of the plan), remote (SSH and the machine check),
bringup (a network up across the machines, `lightpipe cluster up`), checks (its pair
checks and lightpath probes), run (the whole run, `lightpipe emu --cluster` and the
cluster backend) with workload (its controller, jobs, events and replay). Nothing is
imported here, so that building the CLI's parser stays fast.
"""
