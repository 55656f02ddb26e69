"""Shared helpers of the experiment drivers: data preparation, memnodes, computenodes.

Every driver starts its own memnodes on loopback (free ports), runs real processes, and
stops everything it started. Numbers come from the processes' JSON reports.
"""
import argparse
import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BIN = ROOT / "build" / "bin"
DATA = ROOT.parent / "shared" / "data"


def quiet_blas_env():
    """The environment of a process that calls no BLAS (queries, hnswlib's and shine's builds):
    OpenBLAS (linked through Faiss) starts one thread per core at load, which spin with
    sched_yield for ~0.1 s before they sleep; on 2 cores that spin took a third of the first
    measured phase's QPS in some runs (bigann10k efSearch 16: 83-98K against 140K)."""
    return {**os.environ, "OPENBLAS_NUM_THREADS": os.environ.get("OPENBLAS_NUM_THREADS", "1")}


def reference_env():
    """hnswlib-bench's and faiss-bench's environment: quiet_blas_env, and glibc's malloc asks for
    transparent hugepages (madvise; this host's THP mode) for the index it allocates, as the
    memnodes' regions take reserved hugepages: without, hnswlib's graph is on 4 KiB pages."""
    tun = os.environ.get("GLIBC_TUNABLES")
    return {**quiet_blas_env(), "GLIBC_TUNABLES": tun if tun else "glibc.malloc.hugetlb=1"}


def run(args, **kw):
    """Runs a command, raising with its output on failure."""
    p = subprocess.run([str(a) for a in args], capture_output=True, text=True, **kw)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(map(str, args))} failed ({p.returncode}):\n{p.stdout}\n{p.stderr}")
    return p.stdout


SHM_DIR = Path("/dev/shm")


def shm_cleanup(pids):
    """Removes /dev/shm/<pid>:* of processes started here that have ended: libfabric's shm
    provider names its regions after the pid; a process that is killed (SIGKILL, a crash, a
    timeout here) leaves them behind, and once pids wrap a new process whose pid matches a
    stale file fails with `fi_enable: Device or resource busy`. Only the given (exited) pids
    are touched (a clean exit has removed them already)."""
    for pid in pids:
        if pid is None or Path(f"/proc/{pid}").exists():
            continue
        for f in SHM_DIR.glob(f"{pid}:*"):
            try:
                f.unlink()
            except OSError:
                pass


TRANSIENT = ("Device or resource busy",  # a stale shm file of a dead process with the same pid (above)
             "is unreachable",           # computenode: memnode heartbeat answer late (4 s) on an overloaded host
             "no heartbeat",             # memnode relay: a computenode declared gone
             "did not finish within")    # a hung run (e.g. a computenode waiting for a peer declared gone)


def transient_failure(err):
    """True when ERR is one of the TRANSIENT failures (worth a retry with fresh processes)."""
    return any(t in str(err) for t in TRANSIENT)


class Memnodes:
    """N memnodes on loopback, stopped on exit; with replicas R, N ids x R copies
    (`memnode --id I --replicas R --copy C`), copy C of id I at procs[I * R + C]."""

    def __init__(self, n, provider="shm", region="1GiB", workdir=None, load=None, args=(), replicas=1):
        """load: one region image per memnode (memnode i serves load[i], written by
        `computenode build --store-index`); n may then be None (len(load) memnodes).
        args: more memnode flags, e.g. ["--relay-timeout-ms", 60000]."""
        if load is not None:
            load = [Path(x).resolve() for x in load]
            n = len(load) if n is None else n
            if n != len(load):
                raise ValueError(f"Memnodes: {n} memnodes but {len(load)} images")
        self.dir = Path(workdir or tempfile.mkdtemp(prefix="dmh-mn-"))
        self.dir.mkdir(parents=True, exist_ok=True)
        self.provider, self.region, self.replicas, self.args = provider, region, replicas, [str(x) for x in args]
        self.procs, self.addrs, self.retired = [], [], []
        for i in range(n * replicas):
            self.procs.append(self._start(i, load[i // replicas] if load is not None else None))
        for i in range(n * replicas):
            self.addrs.append(self._wait_ready(i))
        self.list = ",".join(self.addrs)

    def _name(self, i):
        return f"memnode{i}" if self.replicas == 1 else f"memnode{i // self.replicas}c{i % self.replicas}"

    def _start(self, i, load=None, listen="127.0.0.1:0", rejoin=False):
        ready = self.dir / f"{self._name(i)}.addr"
        ready.unlink(missing_ok=True)
        log = open(self.dir / f"{self._name(i)}.log", "a" if rejoin else "w")  # a replacement appends
        cmd = [str(BIN / "memnode"), "--id", str(i // self.replicas), "--provider", self.provider, "--listen", listen,
               "--region", self.region, "--ready-file", str(ready)]
        if self.replicas > 1:
            cmd += ["--replicas", str(self.replicas), "--copy", str(i % self.replicas)]
        if rejoin:
            cmd += ["--rejoin"]
        if load is not None:
            cmd += ["--load", str(load)]
        cmd += self.args
        p = subprocess.Popen(cmd, stdout=log, stderr=log)
        log.close()
        return p

    def _wait_ready(self, i):
        ready = self.dir / f"{self._name(i)}.addr"
        deadline = time.time() + 60
        while not (ready.exists() and ready.read_text().strip()):
            if self.procs[i].poll() is not None or time.time() > deadline:
                self.close()
                raise RuntimeError(f"{self._name(i)} did not start: {(self.dir / f'{self._name(i)}.log').read_text()}")
            time.sleep(0.05)
        return ready.read_text().strip()

    def kill(self, i):
        """SIGKILL of physical memnode i (copy i % R of id i // R)."""
        self.procs[i].kill()
        self.procs[i].wait()
        self.retired.append(self.procs[i])

    def replace(self, i):
        """A new, empty memnode in dead copy i's place (`memnode --rejoin` at its address): the
        running computenodes connect it, `computenode rejoin` fills it (docs/replication.md)."""
        self.procs[i] = self._start(i, listen=self.addrs[i], rejoin=True)
        self._wait_ready(i)
        return self.procs[i]

    def close(self):
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        shm_cleanup([p.pid for p in self.procs + self.retired])

    def __enter__(self):
        return self

    def __exit__(self, *a):
        self.close()


CPU_CGROUP = Path("/sys/fs/cgroup/cpu")  # cgroup v1 cpu controller (this host's layout)


class CpuLimits:
    """One cgroup (v1 cpu controller) per computenode, each limited to CPU cores' worth of CPU
    time (cpu.cfs_quota_us), so that K computenodes on one host behave like K machines of equal,
    fixed speed instead of sharing whatever CPU the others leave idle. Removed on exit.
    cpu: one number for every computenode, or a list with one per computenode (machines of
    different speeds; the list repeats if shorter)."""

    def __init__(self, count, cpu):
        if not (CPU_CGROUP / "cpu.cfs_quota_us").exists():
            raise RuntimeError(f"--cn-cpu needs the cgroup v1 cpu controller at {CPU_CGROUP} (not found)")
        cpus = list(cpu) if isinstance(cpu, (list, tuple)) else [cpu]
        if not cpus or any(not c > 0 for c in cpus):
            raise ValueError(f"--cn-cpu: every share must be > 0, got {cpu}")
        self.dirs = []
        for i in range(count):
            c = cpus[i % len(cpus)]
            # The shortest period the kernel allows for the quota (>= 1 ms each): a throttled
            # computenode then waits at most a few ms, far below a query's latency, instead of the
            # default 100 ms period's tens of ms that stall its relay traffic and the others with it.
            quota = 1000 if c < 1 else int(1000 * c)
            period = max(1000, round(quota / c))
            d = CPU_CGROUP / f"dmhnsw-{os.getpid()}-cn{i}"
            d.mkdir(exist_ok=True)
            (d / "cpu.cfs_quota_us").write_text("-1")  # the period may only change while no quota is set
            (d / "cpu.cfs_period_us").write_text(str(period))
            (d / "cpu.cfs_quota_us").write_text(str(quota))
            self.dirs.append(d)

    def enter(self, i):
        """A preexec_fn: the child joins cgroup I before it execs."""
        procs = str(self.dirs[i] / "cgroup.procs")
        return lambda: Path(procs).write_text(str(os.getpid()))

    def close(self):
        for d in self.dirs:
            for _ in range(50):  # the processes may still be exiting
                try:
                    d.rmdir()
                    break
                except OSError:
                    time.sleep(0.1)


def computenodes(mn, provider, num_cns, sub, args, report, logdir=None, timeout=None, fail_grace=10, mode="shine",
                 cn_cpu=None, wire="none"):
    """Runs `computenode ... SUB ARGS` on num_cns processes; returns computenode 0's report.
    cn_cpu: each computenode limited to this many cores' worth of CPU time (CpuLimits); None: no limit.
    wire: computenode --wire (none, cxl, rdma-56g, rdma-100g or LAT_US,GBPS).

    logdir: each computenode's output goes to LOGDIR/cn<i>.log (else through pipes); then, once
    one computenode failed, the others are killed after FAIL_GRACE seconds.
    timeout: seconds; past it every computenode started here is killed and RuntimeError raised.
    mode: --mode shine or dhnsw."""
    limits = CpuLimits(num_cns, cn_cpu) if cn_cpu else None
    try:
        return _computenodes(mn, provider, num_cns, sub, args, report, logdir, timeout, fail_grace, mode, limits,
                             wire)
    finally:
        if limits is not None:
            limits.close()


def _computenodes(mn, provider, num_cns, sub, args, report, logdir, timeout, fail_grace, mode, limits, wire):
    procs, logs = [], []
    Path(report).unlink(missing_ok=True)
    if logdir is not None:
        Path(logdir).mkdir(parents=True, exist_ok=True)
    for i in range(num_cns):
        cmd = [str(BIN / "computenode"), "--mode", mode, "--provider", provider, "--memnodes", mn.list,
               "--cn-id", str(i), "--num-cns", str(num_cns), "--wire", str(wire or "none"), sub] + [str(a) for a in args]
        if i == 0:
            cmd += ["--report", str(report)]
        pre = limits.enter(i) if limits is not None else None
        no_blas = sub == "query" or (mode == "shine" and sub == "build" and "--codes" not in map(str, args))
        env = quiet_blas_env() if no_blas else None
        if logdir is None:
            procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                          preexec_fn=pre, env=env))
        else:
            logs.append(Path(logdir) / f"cn{i}.log")
            with open(logs[-1], "w") as f:
                f.write(" ".join(cmd) + "\n")
                f.flush()
                procs.append(subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, text=True, preexec_fn=pre,
                                              env=env))
    deadline = None if timeout is None else time.time() + timeout
    outs = []
    try:
        if logdir is not None:  # output goes to files: poll, and stop the others soon after one fails
            failed_at = None
            while any(p.poll() is None for p in procs):
                now = time.time()
                if deadline is not None and now > deadline:
                    raise subprocess.TimeoutExpired(sub, timeout)
                if failed_at is None and any(p.returncode not in (None, 0) for p in procs):
                    failed_at = now
                if failed_at is not None and now - failed_at > fail_grace:
                    for p in procs:  # a peer failed: the others would wait for it at a barrier
                        if p.poll() is None:
                            p.kill()
                time.sleep(0.1)
        for p in procs:
            left = None if deadline is None else max(1.0, deadline - time.time())
            outs.append(p.communicate(timeout=left)[0])
    except subprocess.TimeoutExpired:
        for p in procs:  # only the processes started here
            if p.poll() is None:
                p.kill()
        for p in procs:
            p.wait()
        raise RuntimeError(f"computenode {sub} did not finish within {timeout} s (killed; logs: {logdir})")
    finally:
        shm_cleanup([p.pid for p in procs if p.poll() is not None])
    if logdir is not None:
        outs = [f.read_text() for f in logs]
    failed = [i for i, p in enumerate(procs) if p.returncode != 0]
    if failed:
        raise RuntimeError("".join(f"computenode {i} {sub} failed ({procs[i].returncode}):\n{outs[i][-4000:]}\n"
                                   for i in failed))
    return json.loads(Path(report).read_text()), outs[0]


# The synthetic sets (datagen, Gaussian clusters of spread 0.6): rows, dimension, clusters, seed,
# queries. syn1m is experiments/scale_1m's data; syn768 has an embedding's dimension.
SYNTHETIC = {"syn100k": (100000, 128, 100, 11, 1000), "syn1m": (1000000, 128, 1000, 21, 10000),
             "syn768": (100000, 768, 100, 31, 1000)}


def dataset_files(name, work):
    """(base, queries, groundtruth, metric) of bigann10k, wordnet, syn100k, syn1m or syn768; generates the
    synthetic sets into WORK when missing."""
    work = Path(work)
    work.mkdir(parents=True, exist_ok=True)
    if name == "bigann10k":
        d = DATA / "bigann10k"
        base, q, gt, metric = d / "bigann10k_base.bvecs", d / "bigann10k_query.fvecs", d / "bigann10k_groundtruth.ivecs", "l2"
    elif name == "wordnet":
        d = DATA / "wordnet-minilm-384"
        base, q, gt, metric = d / "base.fvecs", d / "query.fvecs", d / "groundtruth.ivecs", "ip"
    elif name in SYNTHETIC:
        n, d, clusters, seed, queries = SYNTHETIC[name]
        base, q, gt, metric = work / f"{name}_base.fvecs", work / f"{name}_query.fvecs", work / f"{name}_gt.ivecs", "l2"
        if not gt.exists():
            with file_lock(work / f".{name}.lock"):
                if not gt.exists():
                    run([BIN / "datagen", "--n", n, "--d", d, "--clusters", clusters, "--spread", 0.6, "--seed", seed,
                         "--queries", queries, "--out-base", base, "--out-queries", q])
                    tmp = gt.with_name(gt.stem + ".tmp" + gt.suffix)  # the suffix names the format
                    run([BIN / "groundtruth", "--base", base, "--queries", q, "--k", 100, "--metric", "l2",
                         "--out", tmp])
                    os.replace(tmp, gt)
    else:
        raise ValueError(name)
    return base, q, gt, metric


def dataset(name, work):
    """(base, workload, metric) for bigann10k, wordnet or syn100k; prepares what is missing."""
    work = Path(work)
    base, q, gt, metric = dataset_files(name, work)
    wl = work / f"{name}_uniform.wl"
    if not wl.exists():
        run([BIN / "workload", "--queries", q, "--groundtruth", gt, "--dist", "uniform", "--count", 1000,
             "--warmup", 100, "--seed", 5, "--out", wl])
    return base, wl, metric


# ---------------------------------------------------------------------------------------------
# SHINE node cache, CSP and query routing experiments (shine_cache, shine_routing,
# shine_cache_ratio, shine_skew, shine_cns): an index is built once per (data set, M,
# efConstruction), stored as memnode images and served again by fresh memnodes for every run.

SHINE_WORK = ROOT / "runs" / "shine_index"  # shared: syn100k, stored indexes, workloads
PYTHON = "/usr/bin/python3"                 # Debian's, with python3-matplotlib
RESULTS_BEGIN = "<!-- results:begin (filled by run.py) -->"
RESULTS_END = "<!-- results:end -->"


def log(*a):
    print(time.strftime("%H:%M:%S"), *a, flush=True)


@contextmanager
def file_lock(path):
    """An exclusive flock on PATH (created when missing) for the with-block, so that drivers
    running at the same time prepare a shared data set or index once."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def shine_index_dir(name, work, m=32, ef_construction=100, memnodes=2):
    tail = "" if memnodes == 2 else f"_mn{memnodes}"
    return Path(work) / f"index_{name}_m{m}_efc{ef_construction}{tail}"


def shine_index(name, work, m=32, ef_construction=100, memnodes=2, build_cns=2, threads=2, provider="shm",
                region="1GiB", timeout=None):
    """The shine index of data set NAME (see dataset_files) with M and efConstruction, built once
    by BUILD_CNS computenodes x THREADS threads on MEMNODES memnodes and stored with
    --store-index under WORK/index_<name>_m<M>_efc<E>/ (with its build.json); returns the image
    paths [memnode-0.img, ...] for Memnodes(load=...) / query_run. Reused when present."""
    work = Path(work).resolve()
    d = shine_index_dir(name, work, m, ef_construction, memnodes)
    images = [d / f"memnode-{i}.img" for i in range(memnodes)]
    if all(p.exists() for p in images):
        return images
    with file_lock(work / f".{d.name}.lock"):
        if all(p.exists() for p in images):
            return images
        base, _, _, metric = dataset_files(name, work)
        d.mkdir(parents=True, exist_ok=True)
        for p in d.glob("memnode-*.img*"):
            p.unlink()
        log(f"building the {name} index (M={m}, efConstruction={ef_construction}, {memnodes} memnodes, "
            f"{build_cns} computenodes x {threads} threads) into {d}")
        t0 = time.time()
        for attempt in range(4):
            try:
                with Memnodes(memnodes, provider, region, d / "logs", args=["--store-dir", d]) as mn:
                    computenodes(mn, provider, build_cns, "build",
                                 ["--data", base, "--m", m, "--ef-construction", ef_construction, "--metric", metric,
                                  "--threads", threads, "--store-index", d],
                                 d / "build.json", logdir=d / "logs", timeout=timeout)
                break
            except RuntimeError as e:
                if attempt == 3 or not transient_failure(e):
                    raise
                log("  retrying the build: " + next(t for t in TRANSIENT if t in str(e)))
        missing = [str(p) for p in images if not p.exists()]
        if missing:
            raise RuntimeError(f"the build stored no image {missing} (logs: {d / 'logs'})")
        log(f"built and stored the {name} index in {time.time() - t0:.0f} s")
    return images


def shine_index_info(images):
    """The build report stored next to shine_index's images (seconds, index_nodes, ...)."""
    p = Path(images[0]).parent / "build.json"
    return json.loads(p.read_text()) if p.exists() else {}


def shine_workload(name, work, dist, count, warmup, seed=5):
    """A workload file of data set NAME's query pool: WARMUP warm-up then COUNT measured queries
    drawn with repetition by DIST (uniform, zipf:S, hot-clusters:S); made once under WORK."""
    work = Path(work).resolve()
    _, q, gt, _ = dataset_files(name, work)
    wl = work / f"{name}_{dist.replace(':', '')}_n{count}_w{warmup}_s{seed}.wl"
    if not wl.exists():
        tmp = wl.with_name(f"{wl.stem}.{os.getpid()}.tmp.wl")
        run([BIN / "workload", "--queries", q, "--groundtruth", gt, "--dist", dist, "--count", count,
             "--warmup", warmup, "--seed", seed, "--out", tmp])
        os.replace(tmp, wl)
    return wl


def query_run(images, num_cns, workload, report, *, ef_search=64, k=10, threads=1, coroutines=4, cache_ratio=0.0,
              cache_bytes=None, admit_probability=None, routing="none", route_batch=None, route_threshold=None,
              repeat_seconds=None, trace=None, extra=(), provider="shm", region="1GiB", logdir=None, timeout=None,
              retries=3, memnode_args=(), cn_cpu=None, wire="none"):
    """One query run on NUM_CNS computenodes (--cn-id 0..K-1 --num-cns K) with the given flags;
    returns computenode 0's merged report (dict; also written to REPORT).

    images: the image paths of shine_index (fresh memnodes serve them for this run and are
    stopped afterwards), or a running Memnodes. trace: directory for the node-cache access traces
    (emptied first; needs a cache). memnode_args: more memnode flags (fresh memnodes only).
    cn_cpu: CPU cores' worth of time per computenode (CpuLimits), None: unlimited.
    wire: computenode --wire.
    Logs: LOGDIR (default REPORT's name + .logs). A run that fails transiently (transient_failure)
    is repeated up to RETRIES times with fresh processes (the failed logs stay in LOGDIR.failed<i>)."""
    report = Path(report)
    report.parent.mkdir(parents=True, exist_ok=True)
    logdir = Path(logdir) if logdir else report.parent / (report.stem + ".logs")
    args = ["--workload", workload, "--k", k, "--ef-search", ef_search, "--threads", threads,
            "--coroutines", coroutines, "--routing", routing]
    args += ["--cache-bytes", cache_bytes] if cache_bytes else ["--cache-ratio", cache_ratio]
    for flag, v in (("--admit-probability", admit_probability), ("--route-batch", route_batch),
                    ("--route-threshold", route_threshold), ("--repeat-seconds", repeat_seconds)):
        if v is not None:
            args += [flag, v]
    if trace:
        trace = Path(trace).resolve()
        shutil.rmtree(trace, ignore_errors=True)
        args += ["--trace", trace]
    args += list(extra)
    if isinstance(images, Memnodes):
        return computenodes(images, provider, num_cns, "query", args, report, logdir=logdir, timeout=timeout,
                            cn_cpu=cn_cpu, wire=wire)[0]
    for attempt in range(retries + 1):
        try:
            with Memnodes(None, provider, region, logdir / "mn", load=images, args=memnode_args) as mn:
                return computenodes(mn, provider, num_cns, "query", args, report, logdir=logdir, timeout=timeout,
                                    cn_cpu=cn_cpu, wire=wire)[0]
        except RuntimeError as e:
            if attempt == retries or not transient_failure(e):
                raise
            log(f"  retrying {report.name} (attempt {attempt + 2}): " +
                next(t for t in TRANSIENT if t in str(e)))
            failed = logdir.with_name(f"{logdir.name}.failed{attempt}")
            shutil.rmtree(failed, ignore_errors=True)
            if logdir.exists():
                logdir.rename(failed)  # kept for inspection
            if trace:
                shutil.rmtree(trace, ignore_errors=True)


def csp_report(dirs, json_out, png=None, x="num_cns"):
    """csp-report over run trace directories (--json JSON_OUT, optionally --png PNG --x X);
    returns the JSON's runs, one per directory in order (chr, chr_max, csp, per_cn, num_cns, ...)."""
    cmd = [BIN / "csp-report"] + [str(d) for d in dirs] + ["--json", json_out]
    if png:
        cmd += ["--png", png, "--x", x]
    run(cmd)
    return json.loads(Path(json_out).read_text())["runs"]


def csp_plot(json_path, png, x="num_cns"):
    """csp-report's own plot (build/bin/csp_plot.py) of a csp-report JSON, e.g. one merged from
    several csp-report calls."""
    run([PYTHON, BIN / "csp_plot.py", "--json", json_path, "--png", png, "--x", x])


def dir_bytes(d):
    d = Path(d)
    return sum(p.stat().st_size for p in d.rglob("*") if p.is_file()) if d.exists() else 0


def drop_traces(d, keep_bytes=1 << 30):
    """Deletes trace directory D when it holds more than KEEP_BYTES; True when deleted."""
    if dir_bytes(d) > keep_bytes:
        shutil.rmtree(d, ignore_errors=True)
        return True
    return False


# The three SHINE implementations of the paper's evaluation (section 8.1).
SHINE_VARIANTS = {
    "baseline": {"cache": False, "routing": "none"},     # Shine-Baseline: no cache
    "cached": {"cache": True, "routing": "none"},        # Shine-Cached: one cache per computenode
    "cached-aqr": {"cache": True, "routing": "adaptive"},  # Shine-Cached-Aqr: + partitioning, adaptive routing
}


def summarize(report):
    """The numbers of a query report's first run that the drivers tabulate."""
    r = report["runs"][0]
    per_cn = [{"cn_id": c["cn_id"], "input": c.get("input"), "routed_away": c.get("routed_away"),
               "received": c.get("received"), "queries": c["queries"], "qps": c.get("qps"),
               "seconds": c.get("seconds"), "cpu_seconds": c.get("cpu_seconds"),
               "cache_hit_rate": c.get("cache", {}).get("hit_rate"),
               "cache_entries": c.get("cache", {}).get("entries"),
               "cache_evictions": c.get("cache", {}).get("evictions")} for c in r.get("per_cn", [])]
    return {"qps": r["qps"], "recall": r["recall"], "chr": r.get("cache_hit_rate", 0.0), "queries": r["queries"],
            "ef_search": r.get("ef_search"),
            "seconds": r["seconds"], "latency_us": r.get("latency_us"), "per_query": r.get("per_query"),
            "cache": report.get("cache"), "partition": report.get("partition"), "routing": report.get("routing"),
            "num_cns": report.get("num_cns"), "per_cn": per_cn}


def shine_measure(images, num_cns, workload, out, tag, *, variant=None, cache_ratio=0.05, routing=None,
                  repeats=1, trace=False, csp=True, keep_trace_bytes=1 << 30, **flags):
    """Runs one configuration REPEATS times (query_run; reports OUT/TAG[-r].json) and returns
    summarize() of the run with the median QPS plus qps_all/chr_all/recall_all. VARIANT (a key of
    SHINE_VARIANTS) sets the cache and routing; TRACE: the first repetition is traced to
    OUT/TAG.trace (its path: trace_dir) and, with CSP, csp-report adds chr_trace, chr_max and csp
    (then the trace directory is deleted when larger than KEEP_TRACE_BYTES; None keeps it)."""
    out = Path(out)
    cache = True
    if variant is not None:
        cache, routing = SHINE_VARIANTS[variant]["cache"], routing or SHINE_VARIANTS[variant]["routing"]
    routing = routing or "none"
    ratio = cache_ratio if cache else 0.0
    runs = []
    for rep in range(repeats):
        name = tag if repeats == 1 else f"{tag}-r{rep}"
        tdir = out / f"{tag}.trace" if (trace and cache and rep == 0) else None
        t0 = time.time()
        rep_ = query_run(images, num_cns, workload, out / f"{name}.json", cache_ratio=ratio, routing=routing,
                         trace=tdir, **flags)
        s = summarize(rep_)
        s["wall_seconds"] = time.time() - t0
        if tdir is not None:
            s.update({"trace_dir": str(tdir), "trace_bytes": dir_bytes(tdir)})
        if tdir is not None and csp:
            cr = csp_report([tdir], out / f"{tag}.csp.json")[0]
            s.update({"chr_trace": cr["chr"], "chr_max": cr["chr_max"], "csp": cr["csp"], "csp_report": cr})
            s["trace_dropped"] = keep_trace_bytes is not None and drop_traces(tdir, keep_trace_bytes)
        log(f"  {name}: {num_cns} cn, cache {ratio:g}, routing {routing}: QPS {s['qps']:.0f}, recall "
            f"{s['recall']:.4f}, CHR {s['chr']:.4f}" + (f", CHR_max {s['chr_max']:.4f}, CSP {s['csp']:.4f}"
                                                       if "csp" in s else "") + f" ({s['wall_seconds']:.0f} s)")
        runs.append(s)
    best = sorted(runs, key=lambda s: s["qps"])[len(runs) // 2]
    res = dict(best)
    for key in ("chr_trace", "chr_max", "csp", "trace_dir", "trace_bytes", "csp_report", "trace_dropped"):
        if key in runs[0]:  # the traced numbers belong to the first repetition
            res[key] = runs[0][key]
    res.update({"qps_all": [r["qps"] for r in runs], "chr_all": [r["chr"] for r in runs],
                "recall_all": [r["recall"] for r in runs], "variant": variant, "routing": routing,
                "cache_ratio": ratio})
    return res


def shine_args(ap, *, sets="wordnet,syn100k", num_cns=4, cache_ratio=0.05):
    """The flags every shine cache/routing driver shares (defaults documented in --help)."""
    g = ap.add_argument_group("common")
    g.add_argument("--sets", default=sets, help="data sets: wordnet, syn100k (100K x 128, l2), bigann10k (default %(default)s)")
    g.add_argument("--num-cns", type=int, default=num_cns, help="computenodes (default %(default)s)")
    g.add_argument("--cache-ratio", type=float, default=cache_ratio,
                   help="node cache per computenode as a share of the index size (default %(default)s)")
    g.add_argument("--ef-search", default="64",
                   help="efSearch: one value, or per data set SET=EF,... (e.g. wordnet=32,syn100k=48; sets not named "
                        "get 64); pick it so recall@10 is about 0.95 like the paper (default %(default)s)")
    g.add_argument("--threads", type=int, default=1, help="worker threads per computenode (default %(default)s)")
    g.add_argument("--coroutines", type=int, default=4, help="coroutines per thread (default %(default)s)")
    g.add_argument("--warmup", type=int, default=5000, help="warm-up queries (routed, cached, not measured; default %(default)s)")
    g.add_argument("--queries", type=int, default=10000, help="measured queries (default %(default)s)")
    g.add_argument("--seed", type=int, default=5, help="workload seed (default %(default)s)")
    g.add_argument("--m", type=int, default=32, help="HNSW M (default %(default)s, like the paper)")
    g.add_argument("--ef-construction", type=int, default=100, help="efConstruction (default %(default)s)")
    g.add_argument("--memnodes", type=int, default=2, help="memnodes (default %(default)s)")
    g.add_argument("--region", default="1GiB", help="memnode region (default %(default)s)")
    g.add_argument("--provider", default="shm", help="fabric provider (default %(default)s)")
    g.add_argument("--admit-probability", type=float, default=0.01,
                   help="level-0 cache admission probability (default %(default)s, like the paper)")
    g.add_argument("--route-batch", type=int, default=200,
                   help="b, queries per routing batch of balanced/adaptive (default %(default)s; the paper: 1000 "
                        "for 80k queries per computenode)")
    g.add_argument("--route-threshold", type=int, default=50,
                   help="t, adaptive: the router waits while its working queue is longer (default %(default)s; "
                        "the paper: 1000 for 128 queries in flight per computenode)")
    g.add_argument("--repeats", type=int, default=1, help="runs per configuration; the median QPS is reported "
                   "(default %(default)s)")
    g.add_argument("--timeout", type=float, default=1800, help="seconds a query run may take; then its processes are "
                   "killed and the run is tried again, at most 3 times (default %(default)s)")
    g.add_argument("--relay-timeout-ms", type=int, default=60000,
                   help="memnode --relay-timeout-ms: a computenode silent this long is gone (default %(default)s; the "
                        "memnode's own 3000 gives false positives on a loaded 2-core host)")
    g.add_argument("--oracle", default="balanced", choices=["balanced", "nearest"],
                   help="computenode --oracle: balanced (centroid distance plus offsets that split the partitioned "
                        "sample evenly) or nearest (centroid distance only, the paper) (default %(default)s)")
    g.add_argument("--adaptive-quota", default="even", choices=["even", "demand"],
                   help="computenode --adaptive-quota: even (b/K scaled by the queue weights, the paper's Algorithm 2) "
                        "or demand (the batch's best-fit counts scaled by them) (default %(default)s)")
    g.add_argument("--cn-cpu", type=cpu_shares, default=None,
                   help="limit each computenode to this many cores' worth of CPU time (cgroup v1 cpu quota), so that "
                        "computenodes act like separate machines of fixed speed; a comma list gives one share per "
                        "computenode (e.g. 0.4,0.4,0.4,0.1: one slow machine); default: no limit")
    g.add_argument("--wire", default="none",
                   help="computenode --wire: none, cxl, rdma-56g, rdma-100g or LAT_US,GBPS; every remote operation "
                        "takes at least the model's time and costs no CPU while it waits, as on RDMA NICs "
                        "(docs/wire-model.md; default %(default)s)")
    g.add_argument("--keep-traces-gb", type=float, default=1.0,
                   help="trace directories larger than this are deleted once csp-report read them (default %(default)s)")
    g.add_argument("--index-work", default=str(SHINE_WORK),
                   help="shared directory of data, indexes and workloads (default %(default)s)")
    g.add_argument("--quick", action="store_true",
                   help="smoke run: bigann10k, 2 computenodes, 200 warm-up + 300 measured queries, "
                        "route batch 50 / threshold 20; results go to WORK/quick/")
    return g


def cpu_shares(text):
    """--cn-cpu: '0.45' or '0.4,0.4,0.4,0.1' -> list of floats > 0 ('0': no limit -> None)."""
    try:
        v = [float(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number or comma list of numbers: {text!r}")
    if v == [0.0]:
        return None
    if any(not x > 0 for x in v):
        raise argparse.ArgumentTypeError(f"shares must be > 0: {text!r}")
    return v


def shine_quick(a):
    """--quick: a tiny setting that runs end to end in a minute or two."""
    if a.quick:
        a.sets, a.num_cns, a.warmup, a.queries = "bigann10k", 2, 200, 300
        a.route_batch, a.route_threshold = 50, 20
        a.timeout = min(a.timeout, 300)
    return a


def ef_search_for(a, name):
    """--ef-search for data set NAME: '64' or 'wordnet=32,syn100k=48' (unnamed sets: 64)."""
    v = str(a.ef_search)
    if "=" not in v:
        return int(v)
    per = dict(x.split("=", 1) for x in v.split(","))
    return int(per.get(name, 64))


def query_flags(a, name):
    """The query_run keyword arguments of shine_args' flags, for data set NAME."""
    return {"ef_search": ef_search_for(a, name), "threads": a.threads, "coroutines": a.coroutines,
            "admit_probability": a.admit_probability, "route_batch": a.route_batch,
            "route_threshold": a.route_threshold, "provider": a.provider, "region": a.region,
            "timeout": a.timeout, "memnode_args": ["--relay-timeout-ms", a.relay_timeout_ms],
            "cn_cpu": a.cn_cpu, "wire": a.wire, "extra": ["--oracle", a.oracle, "--adaptive-quota", a.adaptive_quota]}


def out_dir(a, folder, work):
    """Where results.json/results.md/PNGs go: the experiment folder, or WORK/quick with --quick
    (so smoke runs never overwrite the folder's results); --out overrides."""
    if getattr(a, "out", None):
        return Path(a.out)
    return Path(work) / "quick" if a.quick else Path(folder)


def md_table(header, rows):
    """A Markdown table (header: list of column names; rows: lists of cells)."""
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(out) + "\n"


def write_results(folder, results, md, readme=None):
    """FOLDER/results.json (RESULTS) and FOLDER/results.md (MD); with README, also replaces the
    text between RESULTS_BEGIN and RESULTS_END there by MD."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    (folder / "results.md").write_text(md)
    if readme is not None and Path(readme).exists():
        text = Path(readme).read_text()
        i, j = text.find(RESULTS_BEGIN), text.find(RESULTS_END)
        if i >= 0 and j > i:
            Path(readme).write_text(text[:i + len(RESULTS_BEGIN)] + "\n\n" + md.rstrip("\n") + "\n\n" + text[j:])


def pyplot():
    """matplotlib.pyplot with the Agg backend, or None (with a note) when matplotlib is missing."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        return plt
    except ImportError as e:
        print(f"no plots: matplotlib is missing ({e}); run with {PYTHON} (python3-matplotlib)", file=sys.stderr)
        return None


def command_line():
    return " ".join([Path(sys.argv[0]).as_posix()] + sys.argv[1:])


def shine_header_md(a, results, what=None):
    """The lines above a shine driver's results table: when, the command, the setting."""
    cns = what or f"{a.num_cns} computenodes"
    return (f"Run {results['date']} ({results['seconds'] / 60:.0f} min): `{results['command']}`\n\n"
            f"{cns} x {a.threads} thread x {a.coroutines} coroutines, {a.memnodes} memnodes ({a.provider}), "
            f"cache {a.cache_ratio:g} of the index per computenode (unless varied), level-0 admission "
            f"{a.admit_probability:g}, M={a.m}, efConstruction={a.ef_construction}, efSearch={a.ef_search}, "
            f"{a.warmup} warm-up + {a.queries} measured queries (seed {a.seed}), route batch {a.route_batch}, "
            f"threshold {a.route_threshold}, {a.repeats} run(s) per point (median QPS)"
            + f", {getattr(a, 'oracle', 'balanced')} oracle"
            + (f", adaptive quota {a.adaptive_quota}" if getattr(a, "adaptive_quota", "even") != "even" else "")
            + (f", computenodes limited to {','.join(f'{c:g}' for c in a.cn_cpu)} core(s) of CPU time each"
               if getattr(a, "cn_cpu", None) else "")
            + (f", wire model {a.wire}" if getattr(a, "wire", "none") != "none" else "")
            + ".\n")


def cache_md(name, res):
    """'**name** (index X MiB, cache Y MiB = N vectors per computenode)' from a cached run."""
    c = (res or {}).get("cache") or {}
    ef = f", efSearch {res['ef_search']}" if (res or {}).get("ef_search") else ""
    if not c.get("capacity_bytes"):
        return f"\n**{name}** (index {c.get('index_bytes', 0) / 2**20:.0f} MiB{ef})\n\n"
    return (f"\n**{name}** (index {c.get('index_bytes', 0) / 2**20:.0f} MiB, cache "
            f"{c.get('capacity_bytes', 0) / 2**20:.1f} MiB = {c.get('capacity_entries', 0)} vectors per computenode{ef})\n\n")


def pct(x):
    return "—" if x is None else f"{100 * x:.1f}%"


def num(x, f="{:.2f}"):
    """X formatted with F, or a dash for None."""
    return "—" if x is None else f.format(x)


def policy_flags(flags, pol, extra=()):
    """(routing, query_run flags) of a driver's policy name POL ('adaptive:demand' sets
    --adaptive-quota for that run), from the set's FLAGS (query_flags) plus EXTRA computenode flags."""
    routing, _, quota = pol.partition(":")
    f = dict(flags)
    f["extra"] = list(flags["extra"]) + list(extra)
    if quota:
        f["extra"][f["extra"].index("--adaptive-quota") + 1] = quota
    return routing, f


def load_max_over_mean(summary):
    """Queries answered by the busiest computenode over the mean (1.00 = even), or None."""
    answered = [c["queries"] for c in summary["per_cn"]]
    return max(answered) / (sum(answered) / len(answered)) if answered and sum(answered) else None


def finish_checks(results, checks, t_start):
    """Stores CHECKS, whether all hold, and the run's duration in RESULTS."""
    results["checks"] = checks
    results["all_ok"] = all(c["ok"] for c in checks)
    results["seconds"] = time.time() - t_start


def adaptive_checks(res, **where):
    """The checks QPS(adaptive[:quota]) >= QPS(best-fit) of one point's RES (policy -> shine_measure
    summary); WHERE (e.g. set=..., dist=...) is copied into each check."""
    out = []
    for pol in res:
        if pol.split(":")[0] == "adaptive" and "best-fit" in res:
            q, b = res[pol]["qps"], res["best-fit"]["qps"]
            out.append({**where, "what": f"QPS({pol}) >= QPS(best-fit)", "value": f"{q:.0f} vs {b:.0f}", "ok": q >= b})
    return out


# ---- shared by the shine cache/routing experiment drivers

VARIANTS = ["baseline", "cached", "cached-aqr"]
LABEL = {"baseline": "Shine (no cache)", "cached": "Shine-Cached", "cached-aqr": "Shine-Cached-Aqr"}
COLOR = {"baseline": "0.5", "cached": "C0", "cached-aqr": "C3"}


def experiment_start(name, a, here):
    """(work dir, output dir, start time, results dict) of one experiment run."""
    import time as _time
    work = Path(a.work)
    results = {"experiment": name, "command": command_line(), "date": _time.strftime("%Y-%m-%d %H:%M"),
               "params": vars(a), "sets": {}}
    return work, out_dir(a, here, work), _time.time(), results


def shine_set(a, name):
    """(index images, query flags, index description) of data set `name`, built once."""
    images = shine_index(name, a.index_work, a.m, a.ef_construction, a.memnodes, provider=a.provider,
                         region=a.region, timeout=a.timeout)
    return images, query_flags(a, name), {"dir": str(images[0].parent), "build": shine_index_info(images)}


# ---------------------------------------------------------------------------------------------
# d-HNSW experiments (dhnsw_recall, dhnsw_ablation, dhnsw_cache_ratio, dhnsw_breakdown,
# dhnsw_partitions): an index (balanced partitions, sub-HNSWs, meta-HNSW) is built once per
# (data set, P, M, efConstruction, memnodes, partitioning) by tools/dhnsw-build into region
# images under DHNSW_WORK and served again by fresh memnodes (--load) for every query run. The
# data sets and workloads are shine's (SHINE_WORK).

DHNSW_WORK = ROOT / "runs" / "dhnsw"  # shared: d-HNSW indexes (the experiments' runs go to subfolders)


def dhnsw_index_dir(name, work, partitions, m=16, ef_construction=100, memnodes=1, plain=False, seed=1):
    tail = (f"_mn{memnodes}" if memnodes != 1 else "") + ("_plain" if plain else "") + (f"_s{seed}" if seed != 1 else "")
    # _f2: metadata format 2 (live descriptors, epochs); images of format 1 are refused by computenodes
    return Path(work).resolve() / f"dhnsw_{name}_p{partitions}_m{m}_efc{ef_construction}{tail}_f2"


def dhnsw_index(name, work, partitions, m=16, ef_construction=100, memnodes=1, plain=False, seed=1, threads=None):
    """The d-HNSW index of data set NAME (see dataset_files; the data come from SHINE_WORK) with
    P=PARTITIONS sub-HNSWs of HNSW M / efConstruction over MEMNODES memnodes, partitioned by the
    capacity-constrained k-means (PLAIN: plain k-means), built once by `dhnsw-build` into
    WORK/dhnsw_<name>_p<P>_m<M>_efc<E>[_mn<N>][_plain]_f2/ (index.img, or index.img.0 .. .<N-1>,
    and build.json) under a file lock; returns the image paths for Memnodes(load=...) /
    dhnsw_query. Reused when present."""
    d = dhnsw_index_dir(name, work, partitions, m, ef_construction, memnodes, plain, seed)
    out = d / "index.img"
    images = [out] if memnodes == 1 else [out.with_name(f"{out.name}.{i}") for i in range(memnodes)]
    done = d / "build.json"
    if done.exists() and all(p.exists() for p in images):
        return images
    with file_lock(Path(work).resolve() / f".{d.name}.lock"):
        if done.exists() and all(p.exists() for p in images):
            return images
        base, _, _, metric = dataset_files(name, SHINE_WORK)
        d.mkdir(parents=True, exist_ok=True)
        for p in list(d.glob("index.img*")) + [done]:
            p.unlink(missing_ok=True)
        log(f"building the d-HNSW {name} index (P={partitions}, M={m}, efConstruction={ef_construction}, "
            f"{memnodes} memnode(s){', plain k-means' if plain else ''}) into {d}")
        t0 = time.time()
        tmp = d / "build.json.tmp"  # build.json appears last: it marks a complete build
        cmd = [BIN / "dhnsw-build", "--data", base, "--metric", metric, "--partitions", partitions, "--m", m,
               "--ef-construction", ef_construction, "--memnodes", memnodes, "--seed", seed, "--out", out,
               "--json", tmp]
        if plain:
            cmd.append("--plain-kmeans")
        if threads is not None:
            cmd += ["--threads", threads]
        (d / "build.log").write_text(" ".join(map(str, cmd)) + "\n" + run(cmd))
        missing = [str(p) for p in images if not p.exists()]
        if missing:
            raise RuntimeError(f"dhnsw-build wrote no image {missing} (see {d / 'build.log'})")
        os.replace(tmp, done)
        log(f"built the d-HNSW {name} index in {time.time() - t0:.0f} s")
    return images


def dhnsw_index_info(images):
    """dhnsw-build's JSON report stored next to dhnsw_index's images (partitions.sizes, seconds, ...)."""
    p = Path(images[0]).parent / "build.json"
    return json.loads(p.read_text()) if p.exists() else {}


def dhnsw_query(images, num_cns, workload, report, *, k=10, batch=1000, probe=2, ef_search=64, cache_subs=None,
                cache_ratio=None, regroup=True, doorbell=True, pipeline=True, extra=(), provider="shm", region="1GiB",
                timeout=1800, logdir=None, retries=3, wire="none"):
    """One d-HNSW query run: fresh memnodes serve IMAGES (dhnsw_index), NUM_CNS computenodes run
    `computenode --mode dhnsw query` with the given flags (EF_SEARCH: a number or a comma list,
    one run each in the same process); returns computenode 0's merged report (dict; also in
    REPORT). Logs: LOGDIR (default REPORT's name + .logs). A transient failure
    (transient_failure) is retried up to RETRIES times with fresh processes."""
    report = Path(report)
    report.parent.mkdir(parents=True, exist_ok=True)
    logdir = Path(logdir) if logdir else report.parent / (report.stem + ".logs")
    if isinstance(ef_search, (list, tuple)):
        ef_search = ",".join(str(e) for e in ef_search)
    args = ["--workload", workload, "--k", k, "--batch", batch, "--probe", probe, "--ef-search", ef_search]
    if cache_subs is not None:
        args += ["--cache-subs", cache_subs]
    elif cache_ratio is not None:
        args += ["--cache-ratio", cache_ratio]
    if not regroup:
        args.append("--no-regroup")
    if not doorbell:
        args.append("--no-doorbell")
    if not pipeline:
        args.append("--no-pipeline")
    args += list(extra)
    for attempt in range(retries + 1):
        try:
            with Memnodes(None, provider, region, logdir / "mn", load=images) as mn:
                return computenodes(mn, provider, num_cns, "query", args, report, logdir=logdir, timeout=timeout,
                                    mode="dhnsw", wire=wire)[0]
        except RuntimeError as e:
            if attempt == retries or not transient_failure(e):
                raise
            log(f"  retrying {report.name} (attempt {attempt + 2}): " + next(t for t in TRANSIENT if t in str(e)))
            failed = logdir.with_name(f"{logdir.name}.failed{attempt}")
            shutil.rmtree(failed, ignore_errors=True)
            if logdir.exists():
                logdir.rename(failed)


def dhnsw_run_summary(run):
    """The numbers of one entry of a d-HNSW query report's runs that the drivers tabulate."""
    st, b = run["stages_us"], run["batches"]
    return {"ef_search": run["ef_search"], "queries": run["queries"], "seconds": run["seconds"], "qps": run["qps"],
            "recall": run["recall"], "recall_at_1": run["recall_at_1"], "latency_us": run["latency_us"],
            "stages_us": st, "total_us": st["pipelined_total"], "batches": b, "per_query": run["per_query"]}


def dhnsw_measure(images, workload, report_base, repeats=1, key="total_us", **flags):
    """Runs one d-HNSW configuration REPEATS times (dhnsw_query on 1 computenode, reports
    REPORT_BASE[-r<i>].json) and returns dhnsw_run_summary of the run with the median KEY (of
    its first efSearch) plus KEY_all (every repetition's value) and settings (the report's)."""
    report_base = Path(report_base)
    runs = []
    for rep in range(repeats):
        name = report_base.name if repeats == 1 else f"{report_base.name}-r{rep}"
        r = dhnsw_query(images, 1, workload, report_base.with_name(name + ".json"), **flags)
        s = dhnsw_run_summary(r["runs"][0])
        s["settings"] = r["settings"]
        runs.append(s)
    best = dict(sorted(runs, key=lambda s: s[key])[len(runs) // 2])
    best[f"{key}_all"] = [s[key] for s in runs]
    best["repeats"] = repeats
    return best


def dhnsw_common_args(ap, *, quick_help):
    """Flags every d-HNSW driver shares."""
    g = ap.add_argument_group("common")
    g.add_argument("--m", type=int, default=16, help="HNSW M of the sub-HNSWs (default %(default)s)")
    g.add_argument("--ef-construction", type=int, default=100, help="efConstruction (default %(default)s)")
    g.add_argument("--seed", type=int, default=5, help="workload seed (default %(default)s)")
    g.add_argument("--provider", default="shm", help="fabric provider (default %(default)s)")
    g.add_argument("--wire", default="none", help="computenode --wire: none, cxl, rdma-56g, rdma-100g or LAT_US,GBPS "
                   "(docs/wire-model.md; default %(default)s)")
    g.add_argument("--region", default="1GiB", help="memnode region (default %(default)s)")
    g.add_argument("--timeout", type=float, default=1800, help="seconds a query run may take (default %(default)s)")
    g.add_argument("--work", default=str(DHNSW_WORK), help="d-HNSW indexes and runs (default %(default)s)")
    g.add_argument("--out", default=None, help="results.json/results.md/PNGs (default: this folder; "
                   "WORK/quick/<experiment> with --quick)")
    g.add_argument("--quick", action="store_true", help=quick_help)
    return g


def binaries_identity(names=("computenode", "memnode", "dhnsw-build")):
    """{binary: {mtime, sha256 (first 16 hex digits)}} of the build/bin binaries a run used."""
    import hashlib
    out = {}
    for n in names:
        p = BIN / n
        if p.exists():
            out[n] = {"mtime": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(p.stat().st_mtime)),
                      "sha256": hashlib.sha256(p.read_bytes()).hexdigest()[:16]}
    return out


def dhnsw_start(name, a, here):
    """(work dir of this experiment's runs, output dir, start time, results dict); the results
    record the binaries (binaries_identity) the run starts with."""
    work = Path(a.work).resolve()
    out = Path(a.out) if a.out else (work / "quick" / name if a.quick else Path(here))
    results = {"experiment": name, "command": command_line(), "date": time.strftime("%Y-%m-%d %H:%M"),
               "params": vars(a), "binaries": binaries_identity()}
    return work, out, time.time(), results


def dhnsw_finish(out, here, results, md):
    """Writes results.json/results.md to OUT (and the README's results section when OUT is the
    experiment folder); notes in both when a binary changed during the run."""
    now = binaries_identity()
    results["binaries_changed"] = sorted(n for n in now if results.get("binaries", {}).get(n) != now[n])
    if results["binaries_changed"]:
        note = (f"**Warning:** {', '.join(results['binaries_changed'])} changed in build/bin during this run; "
                f"its numbers mix two builds.\n\n")
        print(note, file=sys.stderr)
        md = note + md
    write_results(out, results, md, readme=Path(here) / "README.md" if Path(out).resolve() == Path(here).resolve() else None)
