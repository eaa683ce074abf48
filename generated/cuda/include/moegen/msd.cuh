// moegen device code: the MSD matmul's schedule rendering helper.
#pragma once

// true when a loop action with this iteration offset runs at `step` (schedule rendering)
__device__ __forceinline__ bool moegen_runs(int step, int offset, int iterations) {
  return step >= offset && step - offset < iterations;
}
