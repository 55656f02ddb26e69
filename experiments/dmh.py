"""Shared helpers of the experiment drivers: data preparation, memnodes, computenodes.

Every driver starts its own memnodes on loopback (free ports), runs real processes, and
stops everything it started. Numbers come from the processes' JSON reports.
"""
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BIN = ROOT / "build" / "bin"
DATA = ROOT.parent / "shared" / "data"


def run(args, **kw):
    """Runs a command, raising with its output on failure."""
    p = subprocess.run([str(a) for a in args], capture_output=True, text=True, **kw)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(map(str, args))} failed ({p.returncode}):\n{p.stdout}\n{p.stderr}")
    return p.stdout


class Memnodes:
    """N memnodes on loopback, stopped on exit."""

    def __init__(self, n, provider="shm", region="1GiB", workdir=None):
        self.dir = Path(workdir or tempfile.mkdtemp(prefix="dmh-mn-"))
        self.dir.mkdir(parents=True, exist_ok=True)
        self.procs, self.addrs = [], []
        for i in range(n):
            ready = self.dir / f"memnode{i}.addr"
            ready.unlink(missing_ok=True)
            log = open(self.dir / f"memnode{i}.log", "w")
            self.procs.append(subprocess.Popen([str(BIN / "memnode"), "--id", str(i), "--provider", provider,
                                                "--listen", "127.0.0.1:0", "--region", region,
                                                "--ready-file", str(ready)], stdout=log, stderr=log))
        for i in range(n):
            ready = self.dir / f"memnode{i}.addr"
            deadline = time.time() + 60
            while not (ready.exists() and ready.read_text().strip()):
                if self.procs[i].poll() is not None or time.time() > deadline:
                    raise RuntimeError(f"memnode {i} did not start: {(self.dir / f'memnode{i}.log').read_text()}")
                time.sleep(0.05)
            self.addrs.append(ready.read_text().strip())
        self.list = ",".join(self.addrs)

    def close(self):
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()

    def __enter__(self):
        return self

    def __exit__(self, *a):
        self.close()


def computenodes(mn, provider, num_cns, sub, args, report):
    """Runs `computenode ... SUB ARGS` on num_cns processes; returns computenode 0's report."""
    procs = []
    for i in range(num_cns):
        cmd = [str(BIN / "computenode"), "--mode", "shine", "--provider", provider, "--memnodes", mn.list,
               "--cn-id", str(i), "--num-cns", str(num_cns), sub] + [str(a) for a in args]
        if i == 0:
            cmd += ["--report", str(report)]
        procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    outs = [p.communicate()[0] for p in procs]
    for i, p in enumerate(procs):
        if p.returncode != 0:
            raise RuntimeError(f"computenode {i} {sub} failed:\n{outs[i]}")
    return json.loads(Path(report).read_text()), outs[0]


def dataset(name, work):
    """(base, workload, metric) for bigann10k, wordnet or syn100k; prepares what is missing."""
    work = Path(work)
    work.mkdir(parents=True, exist_ok=True)
    if name == "bigann10k":
        d = DATA / "bigann10k"
        base, q, gt, metric = d / "bigann10k_base.bvecs", d / "bigann10k_query.fvecs", d / "bigann10k_groundtruth.ivecs", "l2"
    elif name == "wordnet":
        d = DATA / "wordnet-minilm-384"
        base, q, gt, metric = d / "base.fvecs", d / "query.fvecs", d / "groundtruth.ivecs", "ip"
    elif name == "syn100k":
        base, q, gt, metric = work / "syn100k_base.fvecs", work / "syn100k_query.fvecs", work / "syn100k_gt.ivecs", "l2"
        if not gt.exists():
            run([BIN / "datagen", "--n", 100000, "--d", 128, "--clusters", 100, "--spread", 0.6, "--seed", 11,
                 "--queries", 1000, "--out-base", base, "--out-queries", q])
            run([BIN / "groundtruth", "--base", base, "--queries", q, "--k", 100, "--metric", "l2", "--out", gt])
    else:
        raise ValueError(name)
    wl = work / f"{name}_uniform.wl"
    if not wl.exists():
        run([BIN / "workload", "--queries", q, "--groundtruth", gt, "--dist", "uniform", "--count", 1000,
             "--warmup", 100, "--seed", 5, "--out", wl])
    return base, wl, metric
