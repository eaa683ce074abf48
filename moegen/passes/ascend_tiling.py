"""The tiling of the Ascend MSD kernel: the TCubeTiling of each AIC's per-group int4 matmul, the
MSD loop around it, and the vector cores' merge chunk, with the checks a shape must pass.

`msd_tiling` is the one description of it in Python; the emitted host tiling
(templates/ascend/op_host/tiling.h.j2) computes the same fields in C++ and a test compares the
two field by field against the real `kernel_tiling.h`. Keys are the C++ field names.

The capacities are Atlas A2 (ascend910b, `__NPU_ARCH__` 2201) figures: UB 192 KiB a vector core
(TPipe gets 184 KiB here: the last 8 KiB are the library's scratch), L1 512 KiB a cube core
(less 1 KiB left to the library), L0B 64 KiB. The buffers counted are exactly the InitBuffer
calls of the vector and cube code (templates/ascend/op_kernel/msd/).
"""
from __future__ import annotations

from ..spec import SpecError

UB_BYTES = 192 * 1024
UB_RESERVED = 8 * 1024        # the library's scratch at the top of UB
L1_BYTES = 512 * 1024
L1_RESERVED = 1024
L0B_BYTES = 64 * 1024
MAX_ROWS = 16                 # rows of x the MSD kernel serves (steps * M rows of int4 A)
GROUPS = (64, 128)            # a group's int4 row must fill whole 32-byte UB blocks
COLUMN_ALIGN = 64             # an int4 NZ fractal is 64 columns wide
CUBE_ROWS = 16                # NZ tiles pad rows to the fractal height
BLOCK_BYTES = 32
AMAX_ROW_FLOATS = 8
L1_SLOTS = 2
BASE_N_MAX = 512
COPY_FIELD_MAX = 65535        # Nd2NzParams fields are uint16 on this core
COPY_BLOCKS_MAX = 4095        # DataCopyPad blockCount
CHUNK_ALIGN = 16              # merged columns per chunk: whole fp16 blocks


def align_up(x: int, a: int) -> int:
    return (x + a - 1) // a * a


def ub_fixed_bytes(m: int, group: int, steps: int, columns: int) -> int:
    """UB bytes of an AIV that do not depend on the merge chunk: UnfoldA's buffers, the A_max rows
    and the accumulator of its `columns`."""
    unfold = group * (2 + 4 + 4 + 4 + 4 + 2 + 4) + align_up(steps * group // 2, BLOCK_BYTES)
    return (unfold + BLOCK_BYTES + align_up(m * AMAX_ROW_FLOATS * 4, BLOCK_BYTES)
            + m * columns * 4)


def ub_bytes_per_column(m: int, steps: int) -> int:
    """UB bytes each merged column of a chunk adds: scale (half and float), Y (int32 and float) of
    steps * M rows, the M row sums, and M fp16 outputs."""
    return 2 + 4 + steps * m * 8 + m * 4 + m * 2


def l1_bytes(m: int, group: int, steps: int, single_core_n: int) -> int:
    return L1_SLOTS * (align_up(steps * m, CUBE_ROWS) * group // 2 + group * single_core_n // 2)


def workspace_bytes(m: int, n: int, group: int, steps: int, slots: dict) -> int:
    """The user workspace of the op: A_max, the unfolded A and the int32 Y, each with the
    template's slots (the host tiling's WorkspaceBytes)."""
    align = 512
    return (slots["a_max"] * align_up(m * AMAX_ROW_FLOATS * 4, align)
            + slots["a_unfold"] * align_up(steps * m * group // 2, align)
            + slots["y_int"] * align_up(steps * m * n * 4, align))


def msd_tiling(m: int, n: int, k: int, group: int, steps: int, aic_cores: int,
               ub_bytes: int = UB_BYTES - UB_RESERVED,
               l1_capacity: int = L1_BYTES - L1_RESERVED) -> dict:
    """The tiling data of y[m, n] = x[m, k] W[k, n] on `aic_cores` AIC (2 AIV each); raises
    SpecError naming the rule a shape breaks."""
    shape = f"M = {m}, N = {n}, K = {k}"
    if not 1 <= m <= MAX_ROWS:
        raise SpecError(f"msd.m: {m} must be in 1..{MAX_ROWS} for the Ascend MSD kernel "
                        f"(steps x M rows of int4 A in one cube tile)")
    if group not in GROUPS:
        raise SpecError(f"quant.group_size: {group} must be 64 or 128 for the Ascend MSD kernel "
                        "(a group's int4 row fills whole 32-byte blocks)")
    if k % group:
        raise SpecError(f"msd.k: {k} must be a multiple of quant.group_size ({group})")
    if n < COLUMN_ALIGN or n % COLUMN_ALIGN:
        raise SpecError(f"msd.n: {n} must be a multiple of {COLUMN_ALIGN} for the Ascend MSD "
                        "kernel (an int4 fractal is 64 columns)")
    if n // 2 > COPY_FIELD_MAX:
        raise SpecError(f"msd.n: {n}: a weight row of {n // 2} bytes passes the {COPY_FIELD_MAX}"
                        "-byte source stride of a GM -> L1 copy (N <= 131070)")
    single_core_n = align_up(-(-n // aic_cores), COLUMN_ALIGN)
    used = -(-n // single_core_n)
    rows = steps * m
    base_n = min(single_core_n, BASE_N_MAX)
    if base_n * group // 2 * 2 > L0B_BYTES:
        raise SpecError(f"{shape}: a {group} x {base_n} int4 B tile, double-buffered, passes "
                        f"L0B ({L0B_BYTES} bytes)")
    need_l1 = l1_bytes(m, group, steps, single_core_n)
    if need_l1 > l1_capacity:
        raise SpecError(f"{shape}: each AIC's double-buffered A and B tiles need {need_l1} bytes "
                        f"of L1, more than its {l1_capacity} (N over {aic_cores} cores: "
                        f"{single_core_n} columns each)")
    columns = align_up(single_core_n // 2, CHUNK_ALIGN)       # the wider AIV of a pair
    room = ub_bytes - ub_fixed_bytes(m, group, steps, columns)
    chunk = min(columns, room // ub_bytes_per_column(m, steps) // CHUNK_ALIGN * CHUNK_ALIGN)
    if chunk < CHUNK_ALIGN:
        raise SpecError(f"{shape}: an AIV's accumulator of {m} x {columns} fp32 and its buffers "
                        f"leave no room in UB ({ub_bytes} bytes) for {CHUNK_ALIGN} merged "
                        "columns")
    return {
        "matmulTiling": {
            "usedCoreNum": used, "M": rows, "N": n, "Ka": k, "Kb": k,
            "singleCoreM": rows, "singleCoreN": single_core_n, "singleCoreK": k,
            "baseM": align_up(rows, CUBE_ROWS), "baseN": base_n, "baseK": group,
            "depthA1": 2, "depthB1": 2, "stepM": 1, "stepN": 1, "stepKa": 1, "stepKb": 1,
            "dbL0A": 2, "dbL0B": 2, "dbL0C": 1,
        },
        "m": m, "n": n, "k": k, "groupSize": group, "groups": k // group, "steps": steps,
        "tailN": n - (used - 1) * single_core_n, "mergeChunk": chunk,
    }
