"""The tuning database: what `moegen autotune` measured, read by the tile pass (no GPU needed
to read it; `Device.current` asks CuPy).

A database is one JSON file of entries. An entry holds, for one spec on one GPU, the best
config measured at each token count. Its key hashes everything that matters: moegen's version,
the printed IR of the spec's pipeline, the GPU name, the CUDA (NVRTC) version, the spec hash and
the CUDA kernel templates (a tuned config measured on other kernels is not evidence for these).
Entries are written atomically (temp file + rename); an entry for the same spec and GPU whose
metadata no longer matches (another moegen version, a changed spec or pipeline) is ignored, with
one warning line.

Where it lives: `--tuning-db PATH`, else $MOEGEN_TUNING_DB, else ~/.cache/moegen/tuning.json.

The `tile` pass reads the entry through `Tuning.lookup`: each measured token count's best config
serves the token counts nearest to it (bucket edges at the geometric midpoints; T = 1 alone where
the spec's plans give it a bucket of its own), falling back to the documented defaults for
anything an entry does not say.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import sys
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path

from .build import build
from .spec import Spec
from .target import GpuTarget, gpu_target
from .tile_model import MoeConfig, TunedBucket
from .version import __version__

ENV = "MOEGEN_TUNING_DB"
FORMAT = 1


def default_path() -> Path:
    env = os.environ.get(ENV)
    if env:
        return Path(env)
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "moegen" / "tuning.json"


@dataclass(frozen=True)
class Device:
    """What the key needs to know of the GPU."""
    name: str
    cuda: str

    @staticmethod
    def current() -> "Device":
        import cupy as cp
        props = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)
        major, minor = cp.cuda.nvrtc.getVersion()
        return Device(props["name"].decode(), f"nvrtc {major}.{minor}")


def kernel_sources() -> str:
    """Hash of the CUDA templates and device headers (the include tree too) the kernels are
    rendered from."""
    from .resources import data_dir
    root = data_dir("templates") / "cuda"
    digest = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        digest.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


def entry_key(spec: Spec, device: Device) -> str:
    """Hash of (moegen version, printed IR, GPU name, CUDA version, spec hash, kernel templates).
    An MSD entry holds the best config of both lowerings and schedules: its key ignores those
    two keys."""
    if spec.pipeline == "msd_matmul":
        spec = replace(spec, lowering="msd", schedule="preload")
    ir = str(build(spec))
    blob = json.dumps([__version__, ir, device.name, device.cuda, spec.hash, kernel_sources()])
    return hashlib.sha256(blob.encode()).hexdigest()[:24]


def bucket_edges(tokens: list[int], tokens_max: int, single_token: bool = False) -> list[int]:
    """Upper token edge of each measured count's bucket: the geometric midpoints, then max;
    with `single_token` (the spec's plans give T = 1 a bucket of its own) a measured T = 1
    serves T = 1 alone, as there."""
    ts = sorted(tokens)
    edges = [1 if single_token and a == 1 else int(math.floor(math.sqrt(a * b)))
             for a, b in zip(ts, ts[1:])]
    return edges + [tokens_max]


def db_path(path: str | Path | None) -> Path:
    """The database file: `path`, else default_path()."""
    return Path(path) if path is not None else default_path()


def _new_temp_file(path: Path) -> tuple[int, str]:
    """A new file beside `path` (its folder made if missing), as mkstemp gives it: TuningDB.save
    writes it and moves it into place."""
    path.parent.mkdir(parents=True, exist_ok=True)
    return tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")


def check_writable(path: Path) -> None:
    """Raise OSError unless a database can be saved at `path` (TuningDB.save): its folder takes
    a new file and the path is no folder. Checked before a sweep, whose results would otherwise
    be lost at its end."""
    if path.is_dir():
        raise IsADirectoryError(f"{path} is a folder")
    fd, tmp = _new_temp_file(path)
    os.close(fd)
    os.unlink(tmp)


class TuningDB:
    def __init__(self, path: str | Path | None = None, warn=None):
        self.path = db_path(path)
        self.warn = warn or (lambda msg: print(msg, file=sys.stderr))
        self._warned = False
        self.entries: dict[str, dict] = {}
        if self.path.exists():
            try:
                data = json.loads(self.path.read_text())
            except (OSError, json.JSONDecodeError) as exc:
                self.warn(f"moegen: tuning database {self.path} is unreadable ({exc}); ignored")
                data = {}
            if not isinstance(data, dict):
                self.warn(f"moegen: tuning database {self.path} is not a JSON object; ignored")
            elif data and data.get("format") != FORMAT:
                self.warn(f"moegen: tuning database {self.path} has format "
                          f"{data.get('format')!r}, this moegen reads format {FORMAT}; ignored "
                          f"(run moegen autotune again)")
            else:
                self.entries = dict(data.get("entries", {}))

    # --- reading ------------------------------------------------------------------------------
    def entry(self, spec: Spec, device: Device) -> dict | None:
        key = entry_key(spec, device)
        if key in self.entries:
            return self.entries[key]
        stale = [e for e in self.entries.values()
                 if e["meta"]["spec"] == spec.name and e["meta"]["gpu"] == device.name]
        if stale and not self._warned:
            self._warned = True
            old = stale[0]["meta"]
            self.warn(f"moegen: tuning entry for {spec.name} on {device.name} (moegen "
                      f"{old['moegen']}, spec {old['spec_hash']}) no longer matches; ignored "
                      f"(run moegen autotune again)")
        return None

    def lookup_any(self, spec: Spec, gpu: GpuTarget | None = None) -> dict | None:
        """For a compile without a GPU: the first valid entry of this spec, whatever its GPU."""
        for e in self.entries.values():
            meta = e["meta"]
            if meta["spec"] == spec.name:
                found = self.lookup(spec, Device(meta["gpu"], meta["cuda"]), gpu)
                if found:
                    return found
        return None

    def lookup(self, spec: Spec, device: Device, gpu: GpuTarget | None = None) -> dict | None:
        """The tile pass's view (or None). MoE: {"buckets": [TunedBucket, ...]}, each recorded
        config read by MoeConfig.from_record (fields recorded before they existed take the
        values those configs were measured with; a key missing or unknown is a ValueError);
        MSD: the best tile config measured for the spec's lowering ({"block_n", "mma",
        "vec_warps", "cube_warps", "split_k", "stages", "occupancy", "schedule"}, stages and
        occupancy absent from entries recorded before them, or {"split_k"} for dequant).
        `gpu`: the GPU the plan is for (default: the table's entry of the spec's arch)."""
        e = self.entry(spec, device)
        if not e or not e.get("results"):
            return None
        if spec.pipeline == "msd_matmul":
            mine = [r for r in e["results"] if r["config"].get("lowering") == spec.lowering]
            if not mine:
                return None
            return {k: v for k, v in mine[0]["config"].items() if k != "lowering"}
        results = sorted(e["results"], key=lambda r: r["tokens"])
        from .passes.tiling.moe_buckets import single_token_bucket
        single = single_token_bucket(spec.moe.top_k, spec.moe.hidden_size,
                                     gpu or gpu_target(spec.cuda_arch))
        if single and len(results) == 1 and results[0]["tokens"] == 1 and spec.tokens.max > 1:
            # T = 1 alone, as it was measured (its candidates' plans have the single-token
            # bucket); its config serves the other counts too
            results = results * 2
        edges = bucket_edges([r["tokens"] for r in results], spec.tokens.max, single)
        return {"buckets": [TunedBucket(edge, MoeConfig.from_record(r["config"]))
                            for edge, r in zip(edges, results)]}

    # --- writing ------------------------------------------------------------------------------
    def record(self, spec: Spec, device: Device, results: list[dict]) -> str:
        key = entry_key(spec, device)
        self.entries[key] = {
            "meta": {"moegen": __version__, "spec": spec.name, "spec_hash": spec.hash,
                     "gpu": device.name, "cuda": device.cuda},
            "results": results,
        }
        self.save()
        return key

    def save(self) -> None:
        """Atomic: the old file stays whole until the new one is complete."""
        text = json.dumps({"format": FORMAT, "entries": self.entries}, indent=1, sort_keys=True)
        fd, tmp = _new_temp_file(self.path)
        try:
            with os.fdopen(fd, "w") as f:
                f.write(text)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise


class Tuning:
    """What a lowering consults: a database and the device it was measured on."""

    def __init__(self, db: TuningDB, device: Device | None):
        self.db, self.device = db, device

    def lookup(self, spec: Spec, target: str, gpu: GpuTarget | None = None) -> dict | None:
        if target != "cuda":
            return None
        if self.device is None:           # compiling without a GPU: the entry of any GPU
            return self.db.lookup_any(spec, gpu)
        return self.db.lookup(spec, self.device, gpu)


def tuning_for(path: str | Path | None = None, device: "Device | None | str" = "current"):
    """A Tuning over the database at `path` (default place when None), or None when there is no
    database file. device "current" asks the GPU; None accepts an entry of any GPU."""
    db = TuningDB(path)
    if not db.path.exists():
        return None
    if device == "current":
        try:
            device = Device.current()
        except Exception:
            device = None
    return Tuning(db, device)
