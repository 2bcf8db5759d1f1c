"""MetaSchedule's JSON database (the two files stock TVM reads: database_workload.json and
database_tuning_record.json), with whole-line atomic appends, and the lookup of a tuned schedule. Beside them,
written_records.json holds the measurements of the written kernels' configs (sm_90's TIRx kernels, which have no
MetaSchedule trace: tune.written), one WrittenRecord a line, kept and looked up the same way.

Every commit appends its whole line with one write() and an fsync, so interrupting a tuning run at
any moment loses no finished record. A line cut short by a crash can only be the file's last one;
it is dropped on open (with a warning). Any other unreadable line is a one-line error naming the
file and line.
"""
from __future__ import annotations

import json
import logging
import os
import re
from dataclasses import asdict, dataclass
from pathlib import Path

from tvm.s_tir import meta_schedule as ms
from tvm.ir.utils import derived_object

from ..op.kind import parse_spec
from ..target import target_info

log = logging.getLogger(__name__)

WORKLOADS = "database_workload.json"
RECORDS = "database_tuning_record.json"
WRITTEN = "written_records.json"


@dataclass(frozen=True)
class WrittenRecord:
    """One measured config of a written kernel: the op's spec (its text), the GPU arch, the kernel (its rule's `kernel`:
    "Hopper", "cluster"), the config (its text), the mean run time in µs (None: it failed to build, run or match numpy,
    as `error` says)."""

    spec: str
    arch: str
    kernel: str
    config: str
    us: float | None
    error: str = ""


def _append_line(path: Path, obj) -> None:
    data = (json.dumps(obj, separators=(",", ":")) + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        while data:  # one write() in practice; the loop only guards a short write
            data = data[os.write(fd, data):]
        os.fsync(fd)
    finally:
        os.close(fd)


def _replace_bytes(path: Path, data: bytes) -> None:
    """Writes `data` to `path` atomically: a reader or a crash sees the old file or the new, whole."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


LOCK = ".lock"


def lock_database(directory: Path):
    """Takes DIR/.lock for this process (released when it exits, however it ends), or ValueError
    when another process holds it: two tuners appending to one database would interleave their
    workload indices."""
    import fcntl

    key = str(Path(directory).resolve())
    if key in _HELD:
        return _HELD[key]  # this process holds it already (flock would refuse a second descriptor)
    fd = os.open(Path(directory) / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
        os.close(fd)
        raise ValueError(f"db: {directory} is in use by another tvm-b2b tune (pid {holder}); wait for it to end "
                         "or tune into another --db") from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, str(os.getpid()).encode(), 0)
    _HELD[key] = fd
    return fd


_HELD: dict[str, int] = {}  # database directory -> this process's locked descriptor


def record_json(record):
    """A tuning record as plain JSON. TVM 0.27's TuningRecord.as_json fails on traces that hold an
    index map (the ldmatrix layouts of the mma kernel: "Not supported type: IndexMap"); written as
    TVM's own Trace.as_json writes them (tvm.ir.save_json), which TuningRecord.from_json reads back."""
    from tvm.ir import save_json
    from tvm.s_tir.meta_schedule.database.database import _ffi_api
    from tvm.tirx import FloatImm, IndexMap, IntImm
    from tvm_ffi import Array, Map

    def plain(obj):
        if isinstance(obj, Array):
            return [plain(v) for v in obj]
        if isinstance(obj, Map):
            return {plain(k): plain(v) for k, v in obj.items()}
        if isinstance(obj, IntImm | FloatImm):
            return obj.value
        if isinstance(obj, IndexMap):
            return save_json(obj)
        if obj is None or isinstance(obj, bool | int | float | str):
            return obj
        raise TypeError(f"tuning record: cannot write a {type(obj).__name__} as JSON")

    return plain(_ffi_api.TuningRecordAsJSON(record))


def _key(mod) -> int:
    import tvm_ffi

    return tvm_ffi.structural_hash(mod)


def _read_lines(path: Path, repair: bool) -> list:
    """The JSON objects of a database file, or ValueError naming the file and the bad line. A last
    line cut short by a crash is dropped; with `repair` (the writer, holding the lock) also from the
    file, atomically (the whole lines go to a new file that replaces the old one)."""
    if not path.exists():
        return []
    raw = path.read_bytes()
    lines = raw.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    elif lines:  # no final newline: an append cut short, the one place a crash can tear a line
        torn = lines.pop()
        log.warning("%s: %s its last line, cut short by an interrupted write", path, "dropping" if repair else "ignoring")
        if repair:
            _replace_bytes(path, raw[: len(raw) - len(torn)])
    objs = []
    for number, line in enumerate(lines, 1):
        try:
            objs.append(json.loads(line))
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise ValueError(f"{path}: line {number} is not JSON (corrupted tuning database?)") from None
    return objs


@derived_object
class TuningDatabase(ms.database.PyDatabase):
    """A MetaSchedule database kept in DIR as the stock JSON files (ms.database.JSONDatabase opens
    them too), queried in memory."""

    def __init__(self, directory, lock: bool = False):
        """lock: this process is the database's one writer (tvm-b2b tune, shipping): it takes the
        directory's lock first (ValueError if another process holds it) and repairs a torn last line."""
        super().__init__()
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.lock_fd = lock_database(self.dir) if lock else None
        self.mem = ms.database.MemoryDatabase()
        self.workload_index: dict = {}  # structural hash -> line in the workload file
        self.records: dict = {}  # structural hash -> every record (valid or not) of that workload
        self.written: dict[tuple[str, str, str], list[WrittenRecord]] = {}  # (spec text, arch, kernel) -> its records
        self._load()

    def _load(self):
        # records name the tensor intrinsics they tensorize with: register them before parsing
        from ..schedule.common import cuda_tensor_intrinsics

        cuda_tensor_intrinsics()  # slow import: only where a database is read

        workloads = []
        repair = self.lock_fd is not None
        for number, obj in enumerate(_read_lines(self.dir / WORKLOADS, repair), 1):
            try:
                mod = ms.database.Workload.from_json(obj).mod
            except Exception:  # noqa: BLE001 -- any parse failure means the same to the user
                raise ValueError(f"{self.dir / WORKLOADS}: line {number} is not a workload (corrupted tuning database?)") from None
            workloads.append(self.mem.commit_workload(mod))
            self.workload_index[_key(mod)] = number - 1
        for number, obj in enumerate(_read_lines(self.dir / RECORDS, repair), 1):
            try:
                index, record = obj
                self._remember(ms.database.TuningRecord.from_json(record, workloads[index]))
            except Exception:  # noqa: BLE001
                raise ValueError(f"{self.dir / RECORDS}: line {number} is not a tuning record (corrupted tuning database?)") from None
        for number, obj in enumerate(_read_lines(self.dir / WRITTEN, repair), 1):
            try:
                record = WrittenRecord(**obj)
            except TypeError:
                raise ValueError(f"{self.dir / WRITTEN}: line {number} is not a written kernel's record") from None
            self.written.setdefault((record.spec, record.arch, record.kernel), []).append(record)

    # -- the PyDatabase interface ------------------------------------------------------------
    def has_workload(self, mod) -> bool:
        return self.mem.has_workload(mod)

    def commit_workload(self, mod):
        known = self.mem.has_workload(mod)
        workload = self.mem.commit_workload(mod)
        if not known:
            _append_line(self.dir / WORKLOADS, workload.as_json())
            self.workload_index[_key(mod)] = len(self.workload_index)
        return workload

    def commit_tuning_record(self, record) -> None:
        index = self.workload_index[_key(record.workload.mod)]
        _append_line(self.dir / RECORDS, [index, record_json(record)])
        self._remember(record)

    def _remember(self, record) -> None:
        self.mem.commit_tuning_record(record)
        self.records.setdefault(_key(record.workload.mod), []).append(record)

    def get_top_k(self, workload, top_k: int):
        return self.mem.get_top_k(workload, top_k)

    def get_all_tuning_records(self):
        return self.mem.get_all_tuning_records()

    def __len__(self) -> int:
        return len(self.mem)

    # -- helpers -------------------------------------------------------------------------------
    def records_for(self, mod) -> list:
        """Every record (valid or not) of this workload."""
        return list(self.records.get(_key(mod), []))

    # -- the written kernels' records ----------------------------------------------------------
    def commit_written(self, record: WrittenRecord) -> None:
        _append_line(self.dir / WRITTEN, asdict(record))
        self.written.setdefault((record.spec, record.arch, record.kernel), []).append(record)

    def written_for(self, spec_text: str, arch: str, kernel: str) -> list[WrittenRecord]:
        """Every record (valid or not) of the spec's kernel on this arch, fastest valid first."""
        return sorted(self.written.get((spec_text, arch, kernel), []), key=lambda r: (r.us is None, r.us or 0.0))

    def best_written(self, spec_text: str, arch: str, kernel: str) -> WrittenRecord | None:
        """The fastest valid record of the spec's kernel on this arch, or None."""
        best = next(iter(self.written_for(spec_text, arch, kernel)), None)
        return best if best is not None and best.us is not None else None


# -- which database, which record -------------------------------------------------------------
def schedules_root() -> Path:
    """Where the shipped databases live: $TVM_B2B_SCHEDULES, else the installed package data
    tvm_b2b.schedules (pyproject.toml maps the top-level schedules/ there), else, in a checkout or
    an editable install, the checkout's schedules/."""
    if "TVM_B2B_SCHEDULES" in os.environ:
        return Path(os.environ["TVM_B2B_SCHEDULES"])
    from importlib.util import find_spec

    data = find_spec("tvm_b2b.schedules")  # a data directory: a namespace package, found by its path
    if data is not None and data.submodule_search_locations:
        return Path(list(data.submodule_search_locations)[0])
    return Path(__file__).resolve().parents[2] / "schedules"


def gpu_slug(device_name: str) -> str:
    """'NVIDIA H200' -> 'nvidia-h200'."""
    return re.sub(r"[^a-z0-9]+", "-", device_name.lower()).strip("-")


def database_name(device_name: str, arch: str) -> str:
    return f"{gpu_slug(device_name)}-{arch}"


def local_gpu_name() -> str | None:
    import tvm

    from ..target import has_cuda_gpu

    return tvm.cuda(0).device_name if has_cuda_gpu() else None


def find_database(target) -> Path | None:
    """The shipped database for `target`: the local GPU's when this machine has one (another GPU's
    records are never used, even of the same arch); when cross-building with no GPU here, the one
    database of the target's arch, if exactly one exists."""
    info = target_info(target)
    if not info.is_cuda:
        return None
    arch = f"sm_{info.arch}"
    root = schedules_root()
    local = local_gpu_name()
    if local:
        path = root / database_name(local, arch)
        return path if path.is_dir() else None
    found = sorted(p for p in root.glob(f"*-{arch}") if p.is_dir()) if root.is_dir() else []
    if len(found) > 1:
        log.info("no GPU here and %d databases for %s (%s): using none", len(found), arch, ", ".join(p.name for p in found))
    return found[0] if len(found) == 1 else None


def mean_us(run_secs) -> float:
    """A measurement's mean run time in microseconds."""
    secs = [float(s) for s in run_secs]
    return sum(secs) / len(secs) * 1e6


def best_record(database: TuningDatabase, mod, target):
    """The fastest valid record of this workload measured on the target's arch, or None."""
    if not database.has_workload(mod):
        return None
    arch = str(target.attrs.get("arch", ""))
    for record in database.get_top_k(database.commit_workload(mod), 64):
        if str(record.target.attrs.get("arch", "")) == arch:
            return record
    return None


def best_us(spec, target, db="auto") -> float | None:
    """Mean µs of the fastest record of the spec's workload (any op kind; a written kernel's: its fastest config) on the
    target's arch in the database `db` ("auto": the target GPU's shipped one), or None where it holds none."""
    directory = find_database(target) if db == "auto" else db
    if not directory or not target_info(target).is_cuda:
        return None
    rule, best = best_of(spec, target, directory)
    if best is None:
        return None
    return best.us if written(rule) else mean_us(best.run_secs)


def best_of(spec, target, directory):
    """(the rule that runs the spec on the target, its fastest record in `directory` on the target's arch or None): a
    WrittenRecord where the rule's kernel is written, else MetaSchedule's tuning record of its workload."""
    from ..schedule import kind_of, rule_for

    rule, database = rule_for(target, kind_of(spec), spec), open_database(directory)
    if written(rule):
        return rule, database.best_written(spec.to_string(), arch_name(target), rule.kernel)
    return rule, best_record(database, rule.workload(spec), target)


def written(rule) -> bool:
    """Whether the rule's kernel is written (sm_90's TIRx kernels: its configs measured whole, tune.written), not
    scheduled (MetaSchedule searches its trace)."""
    return hasattr(rule, "candidates")


def arch_name(target) -> str:
    """'sm_90'."""
    return f"sm_{target_info(target).arch}"


def record_specs(directory, specs) -> None:
    """Adds the specs to DIR/specs.txt (what the database was tuned for; written atomically)."""
    path = Path(directory) / "specs.txt"
    known = path.read_text().split() if path.exists() else []
    lines = list(dict.fromkeys(known + [s.to_string() for s in specs]))
    tmp = path.with_suffix(".tmp")
    tmp.write_text("\n".join(lines) + "\n")
    os.replace(tmp, path)


GPU_FILE = "gpu.json"  # the GPU a database's records were measured on: {"name": "NVIDIA H200", "arch": "sm_90"}


def measured_gpu(directory) -> tuple[str, str] | None:
    """(name, arch) of the GPU that the database at DIR was measured on, or None (not yet recorded)."""
    path = Path(directory) / GPU_FILE
    if not path.exists():
        return None
    gpu = json.loads(path.read_text())
    return gpu["name"], gpu["arch"]


def note_gpu(directory, name: str, arch: str) -> None:
    """Records the GPU that tuning into DIR measures on (the remote one with --rpc), which is where
    its records ship (schedules/<gpu>-<arch>); ValueError in one line when DIR holds another GPU's."""
    known = measured_gpu(directory)
    if known and known != (name, arch):
        raise ValueError(f"db: {directory} holds records measured on {known[0]} ({known[1]}), not {name} ({arch}); "
                         "tune into another --db")
    if not known:
        _replace_bytes(Path(directory) / GPU_FILE, json.dumps({"name": name, "arch": arch}).encode() + b"\n")


def merge(sources, destination) -> None:
    """Every record of the `sources` databases appended to the one at `destination`."""
    dst = TuningDatabase(destination, lock=True)
    for source in sources:
        src = TuningDatabase(source)
        for record in src.get_all_tuning_records():
            workload = dst.commit_workload(record.workload.mod)
            dst.commit_tuning_record(ms.database.TuningRecord(record.trace, workload, record.run_secs, record.target, record.args_info))
        for records in src.written.values():
            for record in records:
                dst.commit_written(record)
        if (Path(source) / "specs.txt").exists():
            record_specs(destination, [parse_spec(s) for s in (Path(source) / "specs.txt").read_text().split()])


def prune(source, destination, top: int = 3, workloads=None, specs=None) -> int:
    """Copies the `top` fastest valid records of each workload of `source` (of those among `workloads`, IRModules,
    where given), and of each written kernel's spec (of those among `specs`' texts, where given), into a new database
    at `destination` (what ships in schedules/); returns how many."""
    src, dst = TuningDatabase(source), TuningDatabase(destination, lock=True)
    seen, count = set(), 0
    wanted = None if workloads is None else {_key(mod) for mod in workloads}
    for record in src.get_all_tuning_records():
        key = _key(record.workload.mod)
        if key in seen or (wanted is not None and key not in wanted):
            continue
        seen.add(key)
        workload = dst.commit_workload(record.workload.mod)
        for best in src.get_top_k(src.commit_workload(record.workload.mod), top):
            dst.commit_tuning_record(ms.database.TuningRecord(best.trace, workload, best.run_secs, best.target, best.args_info))
            count += 1
    for spec_text, arch, kernel in src.written:
        if specs is None or spec_text in specs:
            for best in [r for r in src.written_for(spec_text, arch, kernel) if r.us is not None][:top]:
                dst.commit_written(best)
                count += 1
    return count


_OPENED: dict[tuple, TuningDatabase] = {}


def open_database(directory) -> TuningDatabase:
    """A TuningDatabase, reused while its files are unchanged; ValueError when DIR is missing."""
    path = Path(directory)
    if not path.is_dir():
        raise ValueError(f"db: {path} is not a directory (a tuning database is a directory)")
    stamp = tuple((path / f).stat().st_mtime_ns if (path / f).exists() else 0 for f in (WORKLOADS, RECORDS, WRITTEN))
    key = (str(path.resolve()), stamp)
    if key not in _OPENED:
        _OPENED[key] = TuningDatabase(path)
    return _OPENED[key]


def tuned_config(spec, target, directory):
    """The config of the best record in `directory` for this spec on the target's arch, or None.
    Records are keyed on the spec's workload (structural equality; a written kernel's on the spec's text), so a record
    of another shape or GPU arch is never applied."""
    from ..schedule.cuda_wmma import config_of

    rule, best = best_of(spec, target, directory)
    if best is None:
        return None
    if written(rule):
        return rule.parse_config(best.config)
    config = config_of(best.trace)
    if config is None:
        log.warning("%s: its record of %s predates the config annotations of tvm-b2b's schedules and is not used; "
                    "convert the database with bench/migrate_records.py", directory, spec.to_string())
    return config


def resolve_config(spec, target, fused: bool, config=None, db="auto"):
    """The schedule parameters a build uses: the given config, else the tuned one from `db`
    (CUDA; a pair fused), else None (the rule's defaults). spec: any op kind's."""
    info = target_info(target)
    if config is not None or not info.is_cuda or not fused or not db:
        return config
    directory = find_database(target) if db == "auto" else db
    if directory is None:
        return None
    from ..schedule import kind_of, rule_for

    rule = rule_for(info, kind_of(spec), spec)
    if rule.can_implement(spec, info) or not (rule.knobs or written(rule)):
        return None  # the schedule rule reports it, or has no parameters to tune
    return tuned_config(spec, target, directory)
