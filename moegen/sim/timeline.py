"""Timelines of simulated schedules: an ASCII Gantt for the terminal and an SVG.

One lane per unit kind and stage, like the seed's pipeline figures: the vector units' unfold,
the matrix units' matmul, the vector units' merge (core 0's units; the others run the same
program). Blocks are labelled with their iteration. A timed run (the cost model's) is drawn in
microseconds, an untimed one (a step a stage) in steps.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..render import render
from .engine import Result

UNIT_LABELS = {"ascend": {"vec": "AIV", "cube": "AIC"},
               "cuda": {"vec": "producer warps", "cube": "MMA warps"}}
LANES = (("vec", "unfold"), ("cube", "matmul"), ("vec", "merge"))
COLORS = {"unfold": "#4c9be8", "matmul": "#e8a33c", "merge": "#5cb85c"}


@dataclass
class Panel:
    title: str
    result: Result
    window_us: float


def time_unit(result: Result) -> str:
    return "us" if result.timed else "steps"


def window(result: Result, iterations: int) -> float:
    """The time by which the first `iterations` iterations are merged (what is drawn)."""
    ends = [s.end for s in result.spans if s.what == "merge" and s.iteration is not None
            and s.iteration < iterations]
    return max(ends) if ends else result.time_us


def lane_spans(result: Result, kind: str, stage: str):
    unit = "cube0" if kind == "cube" else "vec0.0"
    return [s for s in result.spans if s.unit == unit and s.what == stage]


def ascii_gantt(panel: Panel, target: str = "ascend", width: int = 96) -> str:
    labels = UNIT_LABELS[target]
    scale = width / panel.window_us
    unit = time_unit(panel.result)
    head = (f"{panel.title}: {panel.result.time_us:.1f} {unit} in all "
            f"(first {panel.window_us:.1f} {unit})")
    lines = [head]
    name_w = max(len(f"{labels[k]} {s}") for k, s in LANES)
    for kind, stage in LANES:
        row = ["."] * width
        for s in lane_spans(panel.result, kind, stage):
            a, b = int(s.start * scale), int(s.end * scale)
            if a >= width:
                continue
            for x in range(a, min(max(b, a + 1), width)):
                row[x] = str(s.iteration % 10)
        lines.append(f"  {labels[kind] + ' ' + stage:<{name_w}} |{''.join(row)}|")
    start, end = f"0 {unit}", f"{panel.window_us:.1f} {unit}"
    ticks = f"  {'':<{name_w}}  {start}{end:>{width + 1 - len(start)}}"
    lines.append(ticks)
    return "\n".join(lines)


def svg(panels: list[Panel], target: str = "ascend", title: str = "") -> str:
    labels = UNIT_LABELS[target]
    width, left, lane_h, gap = 900, 150, 26, 8
    drawn = []
    y = 40
    for p in panels:
        scale = (width - left - 20) / p.window_us
        lanes = []
        for i, (kind, stage) in enumerate(LANES):
            blocks = [{"x": left + s.start * scale, "w": max((s.end - s.start) * scale, 1.0),
                       "label": s.iteration}
                      for s in lane_spans(p.result, kind, stage) if s.start < p.window_us]
            for b in blocks:
                b["w"] = min(b["w"], width - 20 - b["x"])
            lanes.append({"name": f"{labels[kind]} {stage}", "y": y + 22 + i * (lane_h + gap),
                          "color": COLORS[stage], "blocks": blocks})
        step = _tick(p.window_us)
        ticks = [{"x": left + t * scale, "label": f"{t:g}"}
                 for t in [k * step for k in range(int(p.window_us / step) + 1)]]
        unit = time_unit(p.result)
        drawn.append({"title": f"{p.title}: {p.result.time_us:.1f} {unit} in all", "unit": unit,
                      "y": y, "lanes": lanes, "ticks": ticks,
                      "axis_y": y + 22 + len(LANES) * (lane_h + gap)})
        y += 40 + len(LANES) * (lane_h + gap) + 30
    return render("sim/timeline.svg.j2", width=width, height=y, left=left, lane_h=lane_h,
                  panels=drawn, title=title)


def _tick(span: float) -> float:
    for step in (0.5, 1, 2, 5, 10, 20, 50, 100, 200, 500, 1000):
        if span / step <= 12:
            return step
    return span / 10
