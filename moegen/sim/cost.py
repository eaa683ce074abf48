"""The simulator's cost model: per-stage time = fixed overhead + bytes / bandwidth + work / rate.

A deliberately simple model, for comparing schedules, not for predicting absolute times. Rates
are per unit (one AIC, one AIV) of an Ascend 910B-class chip; the fixed overhead stands for the
pipe synchronisation, instruction issue and DMA latency of one stage, and dominates at decode
sizes (the sample's 396 us over 64 iterations is about 6 us per iteration).

    unfold (vec):  bytes = M*G*2 (read x) + S*M*G/2 (write int4) + M*32 (A_max),
                   work  = 8 vector ops per element per step: 8*S*M*G / vec_ops
                   (each of the vec units does its share: divided by the vec units)
    matmul (cube): bytes = G*Nc/2 (int4 weights) + S*M*G/2 (unfolded A) + S*M*Nc*4 (int32 Y),
                   work  = baseM*G*Nc MACs / cube_macs  (baseM = align16(S*M): the cube pads M)
    merge  (vec):  bytes = S*M*Nc/2*4 (Y) + Nc/2*2 (scale) + M*4,   work = 4*S*M*Nc/2 / vec_ops
    Nc = the columns of one core. A wait costs `sync_us` once its signals are in;
    a barrier among all cores of a kind (mode 0) costs `barrier_us`.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Costs:
    fixed_us: float = 1.0         # per stage
    gm_bytes_per_us: float = 65e3  # per unit: ~1.6 TB/s shared by 24 cores
    vec_ops_per_us: float = 115e3  # per AIV: 64 fp32 lanes at 1.8 GHz
    cube_macs_per_us: float = 29.5e6  # per AIC: int4 16384 MAC/cycle at 1.8 GHz
    sync_us: float = 0.2
    barrier_us: float = 0.5


def _align16(x: int) -> int:
    return (x + 15) // 16 * 16


def stage_costs(m: int, n: int, group: int, steps: int, cores: int,
                costs: Costs = Costs()) -> dict[str, float]:
    """Microseconds of one iteration of each stage on one unit."""
    nc = -(-n // cores)
    bw, vops, macs = costs.gm_bytes_per_us, costs.vec_ops_per_us, costs.cube_macs_per_us
    unfold = (m * group * 2 + steps * m * group / 2 + m * 32) / bw + 8 * steps * m * group / vops
    matmul = ((group * nc / 2 + steps * m * group / 2 + steps * m * nc * 4) / bw
              + _align16(steps * m) * group * nc / macs)
    merge = (steps * m * nc / 2 * 4 + nc + m * 4) / bw + 4 * steps * m * nc / 2 / vops
    return {"unfold": costs.fixed_us + unfold / 2, "matmul": costs.fixed_us + matmul,
            "merge": costs.fixed_us + merge}
