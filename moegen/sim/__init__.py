"""Schedule simulator: executes per-unit action lists, finds hazards and deadlocks, draws
timelines."""
