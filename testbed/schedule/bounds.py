"""Lower bound on the iteration time of any schedule of a pipeline problem."""

from __future__ import annotations

from testbed.schedule.model import PipelineProblem


def lower_bound_ms(problem: PipelineProblem, *, split_backward: bool = False,
                   virtual_stages: int = 1) -> float:
    """A lower bound on the iteration time valid for every schedule of the given form.

    The max of: (1) one micro-batch's critical path forward and back through all
    stages and hops; (2) per stage s, the earliest its first forward can start, plus
    all its compute, plus the shortest way its last backward's gradient still has to
    travel to stage 0; (3) per hop direction (v = 1 only), the earliest first transfer
    plus m serialisations plus the rest of the last micro-batch's path.
    With split backward, the tail after a stage's last I is the chain of I's below
    plus W of stage 0. With v chunks per device, heads and tails use the chunk chain.
    """
    p, m, v = problem.stages, problem.microbatches, max(1, int(virtual_stages))
    wf = problem.weight_grad_fraction if split_backward else 0.0
    f = [x / v for x in problem.forward_ms]
    b = [x / v for x in problem.backward_ms]
    ib = [x * (1.0 - wf) for x in b]
    w0 = b[0] * wf
    hop_cost = [problem.hop_serialisation_ms(h) + problem.hops[h].latency_ms
                for h in range(p - 1)]
    # Virtual chain of v*p stages; boundary k -> k+1 on the device chain or the wrap.
    nv = p * v
    wrap_cost = 0.0
    if v > 1 and p > 1:
        bw = min(h.bandwidth_gbps for h in problem.hops)
        wrap_cost = (8.0 * problem.max_activation_mb() / bw if bw != float("inf") else 0.0) \
            + sum(h.latency_ms for h in problem.hops)

    def link(k: int) -> float:  # cost of boundary k -> k+1 in the virtual chain
        d = k % p
        return hop_cost[d] if d < p - 1 else wrap_cost

    head = [0.0] * nv  # earliest start of F(k, 0)
    for k in range(1, nv):
        head[k] = head[k - 1] + f[(k - 1) % p] + link(k - 1)
    tail = [0.0] * nv  # after the last I/B of stage k ends, time still needed
    tail[0] = w0
    for k in range(1, nv):
        tail[k] = tail[k - 1] + link(k - 1) + ib[(k - 1) % p]
    crit = head[nv - 1] + f[(nv - 1) % p] + ib[(nv - 1) % p] + tail[nv - 1]
    bound = crit
    for d in range(p):
        work = m * v * (f[d] + b[d])
        bound = max(bound, head[d] + work)
        bound = max(bound, head[d] + m * v * (f[d] + ib[d]) + tail[d])
    if v == 1 and p > 1:
        # Each hop direction carries m transfers one after another. The first is ready
        # no earlier than the critical path allows, and after the last one arrives its
        # micro-batch still needs the rest of its critical path: crit + (m-1) * 8a/g.
        ser = max(problem.hop_serialisation_ms(h) for h in range(p - 1))
        bound = max(bound, crit + (m - 1) * ser)
    return bound
