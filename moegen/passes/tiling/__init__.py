"""The tile pass's rules by job (passes/tile.py is the pass): CTA shapes (cta), token buckets
(moe_buckets), MSD tiles (msd), and the pass's MoE and MSD methods (moe_tile, gemm_cta,
msd_tile)."""
