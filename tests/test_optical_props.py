"""Property tests (hypothesis): spectrum invariants under random allocate/release/failures."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from testbed.optical import OpticalNetwork, choose_modulation
from testbed.optical.spectrum import block_mask
from testbed.spec import OpticalSpec
from testbed.topologies import load_library

NSFNET = load_library("nsfnet")
NODES = NSFNET.nodes

ops = st.lists(
    st.tuples(st.sampled_from(["alloc", "alloc", "alloc", "release", "cut", "repair", "lose"]),
              st.integers(0, 10**6)),
    min_size=1, max_size=60)


def check_invariants(net: OpticalNetwork) -> None:
    held: dict[int, int] = {}
    for lp in net.lightpaths.values():
        mask = block_mask(lp.first_slot, lp.n_slots)
        assert lp.first_slot >= 0 and lp.first_slot + lp.n_slots <= net.slots  # contiguous
        # continuous: consecutive fibres join up from src to dst
        assert lp.fibres[0][0] == lp.src and lp.fibres[-1][1] == lp.dst
        for (_, v), (u2, _) in zip(lp.fibres, lp.fibres[1:], strict=False):
            assert v == u2
        mod = choose_modulation(lp.length_km, net.modulations)
        assert mod is not None and mod.name == lp.modulation
        assert lp.length_km <= mod.reach_km
        for u, v in lp.fibres:
            assert not net.is_failed(u, v)
            s = net.spectrum_id(u, v)
            assert net._blocked[s] & mask == 0, "lightpath on out-of-service slots"
            assert held.get(s, 0) & mask == 0, "two lightpaths share a slot"
            held[s] = held.get(s, 0) | mask
    # the bitmaps hold exactly the live lightpaths' slots
    for s in range(net.n_spectra):
        assert net._occ[s] == held.get(s, 0)


@settings(max_examples=60, deadline=None)
@given(ops=ops, policy=st.sampled_from(["first_fit", "last_fit", "random_fit", "best_fit"]),
       slots=st.integers(4, 40), guard=st.integers(0, 2),
       sharing=st.sampled_from(["shared", "per_direction"]))
def test_invariants_hold(ops: list[tuple[str, int]], policy: str, slots: int, guard: int,
                         sharing: str) -> None:
    net = OpticalNetwork(NSFNET, OpticalSpec(slots=slots, guard_slots=min(guard, slots - 1),
                                             k_paths=3, spectrum_sharing=sharing))
    rng = random.Random(0)
    for op, x in ops:
        r = random.Random(x)
        if op == "alloc":
            src, dst = r.sample(NODES, 2)
            net.allocate(src, dst, bitrate_gbps=r.choice([10, 100, 200, 400]),
                         policy=policy, rng=rng)
        elif op == "release" and net.lightpaths:
            lp = r.choice(list(net.lightpaths.values()))
            before = [net._occ[s] for s in range(net.n_spectra)]
            net.release(lp)
            mask = block_mask(lp.first_slot, lp.n_slots)
            for s in range(net.n_spectra):
                freed = before[s] & ~net._occ[s]
                assert freed == (mask if s in lp.path.spectra else 0)
        else:
            f = r.choice(NSFNET.fibres)
            if op == "cut":
                for lp in net.fail_link(f.u, f.v):
                    assert lp.id not in net.lightpaths
            elif op == "repair":
                net.repair_link(f.u, f.v)
            elif op == "lose":
                first = r.randrange(slots)
                net.block_slots(f.u, f.v, first, 1)
        check_invariants(net)
