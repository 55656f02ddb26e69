#!/usr/bin/python3
"""Chaos: faults injected into running clusters over tcp, in network namespaces (see README.md).

Every run is a fresh cluster: 2 memnodes in namespace dmhc-mem (10.77.0.1), computenodes in
namespace dmhc-cn (10.77.0.2), joined by a veth pair, with a cluster token. During one of three
phases it injects one fault, then watches every process that was not hit:

  phases  shine-build   2 computenodes build a shine index (1,000 SIFT vectors)
          shine-query   2 computenodes answer 2,000 queries on one of 1,000 with adaptive routing (the relay)
          dhnsw-insert  2 computenodes insert 2,000 vectors into a d-HNSW index while a third
                        queries
  faults  kill-memnode / stop-memnode    SIGKILL / SIGSTOP (SIGCONT 20 s later) a random memnode
          kill-cn / stop-cn              the same for a random computenode
          partition                      every packet between the namespaces dropped for 20 s
          loss                           5 % of the packets dropped (nftables), for the rest of the run
          slow                           the computenodes' link limited to 2 Mbit/s (tbf)

A survivor must finish, or fail with an error that names the peer (memnode id or address,
computenode id), within a bound after the fault; one still running 60 s after the fault is
a hang. For dhnsw-insert, every insert a computenode acknowledged ("N / M acknowledged",
or its final report) before or after the fault is queried by itself afterwards (all
partitions probed) and must be found, whenever the memnodes survived.
The kernel here has no netem (CONFIG_NET_SCH_NETEM is not set): loss comes from nftables'
random numbers, delay from a token bucket's queue.

--replicas R (R >= 2): each of the 2 memnode ids is a replica set of R copies (memnode<id>c<copy>,
docs/replication.md), every copy in the computenodes' --memnodes; kill-memnode and stop-memnode
hit one random copy, and the outcome is stricter: every surviving computenode exits 0, and for
dhnsw-insert the acknowledged inserts are checked (the set goes on with its live copies; a
stopped copy stays fenced after its SIGCONT) and none may be lost. Results go to
results-replicas.json (results.json keeps the R = 1 runs).

  experiments/chaos/run.py [--phases ...] [--faults ...] [--seed 1] [--replicas 1] [--out experiments/chaos]
"""
import argparse
import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import dmh  # noqa: E402

HERE = Path(__file__).resolve().parent
BIG = dmh.DATA / "bigann10k"
PHASES = ["shine-build", "shine-query", "dhnsw-insert"]
FAULTS = ["kill-memnode", "stop-memnode", "kill-cn", "stop-cn", "partition", "loss", "slow"]
ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
ap.add_argument("--phases", default=",".join(PHASES))
ap.add_argument("--faults", default=",".join(FAULTS))
ap.add_argument("--seed", type=int, default=1)
ap.add_argument("--bound-s", type=float, default=15, help="a survivor ends within this long after the fault")
ap.add_argument("--victim", default="", help="kill or stop this process (memnode0, cn1, inserter0, querier, ...) "
                                           "instead of a random one, where the phase has it")
ap.add_argument("--replicas", type=int, default=1, help="copies of each memnode id (a replica set, "
                                                          "docs/replication.md); R >= 2 writes results-replicas.json")
ap.add_argument("--out", default=str(HERE))
args = ap.parse_args()
if not 1 <= args.replicas <= 8:
    ap.error("--replicas: 1..8")
R = args.replicas
rng = random.Random(args.seed)

MEM, CN = "dmhc-mem", "dmhc-cn"
MEM_IP, CN_IP = "10.77.0.1", "10.77.0.2"
work = Path(tempfile.mkdtemp(prefix="dmh-chaos-"))
(work / "bin").mkdir()
for b in ("memnode", "computenode", "workload"):
    subprocess.run(["cp", dmh.BIN / b, work / "bin" / b], check=True)
BIN = work / "bin"
token = work / "token"
token.write_text(os.urandom(16).hex() + "\n")
token.chmod(0o600)


def sh(*cmd, check=True):
    return subprocess.run([str(c) for c in cmd], check=check, capture_output=True, text=True)


def netns_up():
    netns_down()
    sh("ip", "netns", "add", MEM)
    sh("ip", "netns", "add", CN)
    sh("ip", "link", "add", "dmhc0", "netns", MEM, "type", "veth", "peer", "name", "dmhc1", "netns", CN)
    for ns, dev, ip in ((MEM, "dmhc0", MEM_IP), (CN, "dmhc1", CN_IP)):
        sh("ip", "-n", ns, "addr", "add", f"{ip}/24", "dev", dev)
        sh("ip", "-n", ns, "link", "set", dev, "up")
        sh("ip", "-n", ns, "link", "set", "lo", "up")


def netns_down():
    for ns in (MEM, CN):
        sh("ip", "netns", "del", ns, check=False)


def nft(rule_expr):
    """Drops the computenodes' packets matching RULE_EXPR (in their namespace, both ways)."""
    sh("ip", "netns", "exec", CN, "nft", "add", "table", "inet", "chaos")
    for hook in ("input", "output"):
        sh("ip", "netns", "exec", CN, "nft", "add", "chain", "inet", "chaos", hook,
           f"{{ type filter hook {hook} priority 0 ; }}")
        sh("ip", "netns", "exec", CN, "nft", "add", "rule", "inet", "chaos", hook, *rule_expr.split(), "drop")


def nft_clear():
    sh("ip", "netns", "exec", CN, "nft", "delete", "table", "inet", "chaos", check=False)


class Proc:
    def __init__(self, name, ns, argv, logdir):
        self.name, self.log = name, logdir / f"{name}.log"
        with open(self.log, "w") as f:
            f.write(" ".join(map(str, argv)) + "\n")
            f.flush()
            self.p = subprocess.Popen(["ip", "netns", "exec", ns] + [str(a) for a in argv], stdout=f,
                                      stderr=subprocess.STDOUT)
        self.end = None

    def poll(self):
        if self.end is None and self.p.poll() is not None:
            self.end = time.time()
        return self.p.returncode if self.end is not None else None

    def text(self):
        return self.log.read_text(errors="replace")


def memnodes(logdir):
    if R > 1:
        return replica_memnodes(logdir)
    procs, addrs = [], []
    for i in range(2):
        ready = logdir / f"mn{i}.addr"
        procs.append(Proc(f"memnode{i}", MEM, [BIN / "memnode", "--id", i, "--provider", "tcp", "--listen",
                                                 f"{MEM_IP}:0", "--region", "256MiB", "--token-file", token,
                                                 "--ready-file", ready], logdir))
        deadline = time.time() + 30
        while not (ready.exists() and ready.read_text().strip()):
            if procs[-1].poll() is not None or time.time() > deadline:
                raise RuntimeError(f"memnode {i} did not start: {procs[-1].text()}")
            time.sleep(0.05)
        addrs.append(ready.read_text().strip())
    return procs, ",".join(addrs)


def replica_memnodes(logdir):
    """R copies of each of the 2 memnode ids: memnode<i>c<c>, each knowing its id (mn_id) and address."""
    procs, addrs = [], []
    for i in range(2):
        for c in range(R):
            ready = logdir / f"mn{i}c{c}.addr"
            p = Proc(f"memnode{i}c{c}", MEM, [BIN / "memnode", "--id", i, "--replicas", R, "--copy", c, "--provider",
                                              "tcp", "--listen", f"{MEM_IP}:0", "--region", "256MiB", "--token-file",
                                              token, "--ready-file", ready], logdir)
            procs.append(p)
            deadline = time.time() + 30
            while not (ready.exists() and ready.read_text().strip()):
                if p.poll() is not None or time.time() > deadline:
                    raise RuntimeError(f"memnode {i} copy {c} did not start: {p.text()}")
                time.sleep(0.05)
            p.mn_id, p.addr = i, ready.read_text().strip()
            addrs.append(p.addr)
    return procs, ",".join(addrs)


def computenode(name, mode, mn, cn_id, num, *rest, logdir):
    return Proc(name, CN, [BIN / "computenode", "--mode", mode, "--provider", "tcp", "--memnodes", mn,
                           "--token-file", token, "--cn-id", cn_id, "--num-cns", num, *rest], logdir)


def run_cn(mode, mn, *rest, logdir, name):
    p = computenode(name, mode, mn, 0, 1, *rest, logdir=logdir)
    if p.p.wait(timeout=600) != 0:
        raise RuntimeError(f"{name} failed: {p.text()[-3000:]}")


def fvecs_of_rows(rows, dst):
    """The bvecs rows ROWS of bigann10k as fvecs (the self-queries of inserted vectors)."""
    raw = np.fromfile(BIG / "bigann10k_base.bvecs", dtype=np.uint8).reshape(-1, 4 + 128)
    x = raw[rows, 4:].astype(np.float32)
    out = np.empty((len(rows), 129), dtype=np.float32)
    out.view(np.int32)[:, 0] = 128
    out[:, 1:] = x
    out.tofile(dst)


def ivecs(ids, k, dst):
    out = np.empty((len(ids), k + 1), dtype=np.int32)
    out[:, 0] = k
    out[:, 1:] = np.asarray(ids, dtype=np.int32)[:, None]
    out.tofile(dst)


def names_peer(text, victim):
    """Does an error line of TEXT name the peer that was hit (or, for network faults, any peer)?"""
    errs = [l for l in text.splitlines() if "[error]" in l or "error:" in l.lower() or "failed" in l]
    pats = [r"memnode \d", r"computenode \d", re.escape(MEM_IP)] if victim is None else victim
    return any(re.search(p, l) for l in errs for p in pats), (errs[-1][-300:] if errs else "")


BASE = BIG / "bigann10k_base.bvecs"
WL = work / "q.wl"
dmh.run([BIN / "workload", "--queries", BIG / "bigann10k_query.fvecs", "--groundtruth",
         BIG / "bigann10k_groundtruth.ivecs", "--dist", "uniform", "--count", 100000, "--warmup", 0, "--seed", 1,
         "--out", WL])
WL_SHINE = work / "q2000.wl"  # shine-query: 2,000 queries (a query run ends when its share is answered)
dmh.run([BIN / "workload", "--queries", BIG / "bigann10k_query.fvecs", "--groundtruth",
         BIG / "bigann10k_groundtruth.ivecs", "--dist", "uniform", "--count", 2000, "--warmup", 0, "--seed", 2,
         "--out", WL_SHINE])
BUILT, INS_END = 2000, 4000  # dhnsw: built rows, then rows [BUILT, INS_END) inserted


def one_run(phase, fault, k):
    logdir = work / f"{k:02d}-{phase}-{fault}"
    logdir.mkdir()
    netns_up()
    mns, mn = memnodes(logdir)
    cns = []
    if phase == "shine-build":
        cns = [computenode(f"cn{i}", "shine", mn, i, 2, "build", "--data", BASE, "--max-elements", 1000, "--metric",
                           "l2", "--m", 16, "--threads", 1, logdir=logdir) for i in range(2)]
    elif phase == "shine-query":
        run_cn("shine", mn, "build", "--data", BASE, "--max-elements", 1000, "--metric", "l2", "--m", 16,
               "--threads", 2, logdir=logdir, name="build")
        cns = [computenode(f"cn{i}", "shine", mn, i, 2, "query", "--workload", WL_SHINE, "--ef-search", 32,
                           "--threads", 1, "--cache-ratio", 0.05, "--routing", "adaptive", "--route-batch", 50,
                           "--route-threshold", 100, logdir=logdir) for i in range(2)]
    else:
        run_cn("dhnsw", mn, "build", "--data", BASE, "--max-elements", BUILT, "--metric", "l2", "--partitions", 8,
               "--internal-gap", 0.1, "--overflow-gap", 0.1, logdir=logdir, name="build")
        cns = [computenode("querier", "dhnsw", mn, 0, 1, "query", "--workload", WL, "--batch", 100, "--probe", 2,
                           "--threads", 1, "--mix", "insert:0", "--repeat-seconds", 40, logdir=logdir)]
        cns += [computenode(f"inserter{i}", "dhnsw", mn, 1 + i, 3, "insert", "--data", BASE, "--begin", BUILT, "--end",
                            INS_END, "--share", f"{i}/2", "--batch", 50, "--threads", 1, "--report",
                            logdir / f"ins{i}.json", logdir=logdir) for i in range(2)]
    everyone = mns + cns
    t_phase = time.time()
    time.sleep(rng.uniform(2, 5))  # into the phase
    victim, victim_pat = None, None
    t_fault = time.time()
    if fault in ("kill-memnode", "stop-memnode", "kill-cn", "stop-cn"):
        pool = mns if "memnode" in fault else [c for c in cns if c.poll() is None] or cns
        victim = rng.choice(pool)
        if args.victim and any(p.name == args.victim for p in pool):
            victim = next(p for p in pool if p.name == args.victim)
        victim.p.send_signal(signal.SIGKILL if fault.startswith("kill") else signal.SIGSTOP)
        if "memnode" in fault and R > 1:
            victim_pat = [rf"memnode {victim.mn_id}\b", re.escape(victim.addr)]
        elif "memnode" in fault:
            i = mns.index(victim)
            victim_pat = [rf"memnode {i}\b", re.escape(mn.split(",")[i])]
        else:
            victim_pat = [r"computenode \d", r"memnode \d"]  # a peer computenode, or a relay that dropped it
    elif fault == "partition":
        nft(f"ip daddr {MEM_IP}")
    elif fault == "loss":
        nft("numgen random mod 100 < 5")
    elif fault == "slow":
        sh("ip", "netns", "exec", CN, "tc", "qdisc", "add", "dev", "dmhc1", "root", "tbf", "rate", "2mbit", "burst",
           "32kbit", "latency", "400ms")
    survivors = [p for p in everyone if p is not victim]
    restored = False
    while time.time() - t_fault < 60:
        for p in everyone:
            p.poll()  # every process each turn, so each end time is recorded when it happens
        if all(p.poll() is not None for p in cns if p is not victim):
            break
        if not restored and time.time() - t_fault > 20:
            restored = True
            if fault.startswith("stop"):
                victim.p.send_signal(signal.SIGCONT)
            if fault == "partition":
                nft_clear()
        time.sleep(0.1)
    if fault.startswith("stop") and not restored:
        victim.p.send_signal(signal.SIGCONT)
    hung = [p.name for p in cns if p is not victim and p.poll() is None]
    # Still running but still logging progress: slow (a loaded host), not hung; say which.
    # A shine query prints "N answered here" every 10 s, also while it waits for routed queries
    # from a slower peer: the run is progressing when the answers of all its computenodes grew.
    def answered():
        return sum(int(m[-1]) if (m := re.findall(r"(\d+) answered here", p.text())) else 0 for p in cns)
    sizes = {p.name: p.log.stat().st_size for p in cns if p.name in hung}
    before = answered()
    time.sleep(12)  # query prints a progress line every 10 s
    grew = answered() > before
    progressing = [n for n in hung if (grew if phase == "shine-query" else
                                       next(p for p in cns if p.name == n).log.stat().st_size > sizes[n])]
    # Acknowledged inserts (before the memnodes stop), then every process stops.
    acked = []
    if phase == "dhnsw-insert":
        for i in range(2):
            p = next(c for c in cns if c.name == f"inserter{i}")
            mine = [r for r in range(BUILT, INS_END) if (r - BUILT) % 2 == i]  # --share i/2 over [BUILT, INS_END)
            m = re.findall(r"(\d+) / \d+ acknowledged", p.text())
            n = int(m[-1]) if m else 0
            rep = logdir / f"ins{i}.json"
            if not rep.exists():  # computenode i > 0 writes REPORT.cn<i>, whatever R
                rep = logdir / f"ins{i}.json.cn{1 + i}"
            if p.poll() == 0 and rep.exists():
                n = json.loads(rep.read_text())["insert"]["inserted"]
            acked += mine[:n]
    memnodes_alive = all(p.poll() is None for p in mns if p is not victim) and victim not in mns
    if R > 1:  # a replica set is alive while one of its copies is (a stopped copy stays fenced)
        memnodes_alive = all(any(p.poll() is None and p is not victim for p in mns if p.mn_id == i)
                             for i in range(2))
    lost = None
    if phase == "dhnsw-insert" and acked and memnodes_alive and (R > 1 or not fault.startswith("stop-memnode")):
        nft_clear()
        sample = sorted(rng.sample(acked, min(300, len(acked))))
        fvecs_of_rows(sample, logdir / "self.fvecs")
        ivecs(sample, 10, logdir / "self.ivecs")
        dmh.run([BIN / "workload", "--queries", logdir / "self.fvecs", "--groundtruth", logdir / "self.ivecs",
                 "--dist", "uniform", "--count", len(sample), "--warmup", 0, "--seed", 1, "--out", logdir / "self.wl"])
        try:
            run_cn("dhnsw", mn, "query", "--workload", logdir / "self.wl", "--probe", 8, "--ef-search", 200,
                   "--batch", 300, "--report", logdir / "self.json", logdir=logdir, name="check")
            r1 = json.loads((logdir / "self.json").read_text())["runs"][0]["recall_at_1"]
            lost = round((1 - r1) * len(sample))
        except RuntimeError as e:
            lost = f"check failed: {str(e)[-300:]}"
    for p in everyone:
        if p.poll() is None:
            p.p.send_signal(signal.SIGCONT)
            p.p.kill()
        p.p.wait()
    nft_clear()
    res = {"phase": phase, "fault": fault, **({"replicas": R} if R > 1 else {}),
           "victim": victim.name if victim else None,
           "fault_at_s": round(t_fault - t_phase, 1), "hung": [n for n in hung if n not in progressing],
           "still_progressing_at_60s": progressing,
           "acknowledged_inserts": len(acked), "acknowledged_checked": None if lost is None else min(300, len(acked)),
           "acknowledged_lost": lost, "survivors": []}
    for p in survivors:
        if p in mns and p.end is None:
            continue  # a memnode serving on is the expected outcome
        out = p.text()
        code = p.p.returncode
        named, last_err = names_peer(out, victim_pat)
        after = None if p.end is None else round(p.end - t_fault, 1)
        res["survivors"].append({"name": p.name, "exit": code, "after_fault_s": after, "error_names_peer": named,
                                 "last_error": last_err})
    # A survivor still answering at 60 s (a lossy or slow link) is slow, not stuck: it counts
    # as expected, and the table says so.
    ok = not res["hung"] and all(s["exit"] == 0 or s["name"] in progressing or
                                 (s["error_names_peer"] and s["after_fault_s"] is not None and
                                  s["after_fault_s"] <= args.bound_s)
                                 for s in res["survivors"]) and lost in (None, 0)
    if R > 1 and "memnode" in fault:
        # One copy of a set hit: the set goes on, so no survivor may fail (not even naming the
        # copy), and for inserts the check must have run and found every acknowledged insert.
        ok = not hung and all(s["exit"] == 0 for s in res["survivors"]) and \
            (lost == 0 if phase == "dhnsw-insert" else lost is None)
    res["expected"] = ok
    return res


results = []
k = 0
try:
    for phase in args.phases.split(","):
        for fault in args.faults.split(","):
            if fault in ("loss", "slow") and phase != "shine-query":
                continue  # network degradation: the query phase, where throughput and deadlines meet
            t = time.time()
            try:
                r = one_run(phase, fault, k)
            except Exception as e:  # a setup failure is recorded, not fatal to the other runs
                r = {"phase": phase, "fault": fault, **({"replicas": R} if R > 1 else {}),
                     "setup_error": str(e)[-1000:], "expected": False}
            r["wall_s"] = round(time.time() - t, 1)
            results.append(r)
            dmh.log(json.dumps(r)[:600])
            k += 1
finally:
    netns_down()
out = Path(args.out)
out.mkdir(parents=True, exist_ok=True)
res_file = out / ("results.json" if R == 1 else "results-replicas.json")  # R = 1 runs stay apart
prev = json.loads(res_file.read_text()) if res_file.exists() else {"runs": []}
def cell(r):
    return (r["phase"], r["fault"]) if R == 1 else (r.get("replicas", 1), r["phase"], r["fault"])
redone = {cell(r) for r in results}  # a partial re-run replaces those runs only
runs = [r for r in prev["runs"] if cell(r) not in redone] + results
runs.sort(key=lambda r: (PHASES.index(r["phase"]), FAULTS.index(r["fault"])) if R == 1 else
          (r.get("replicas", 1), PHASES.index(r["phase"]), FAULTS.index(r["fault"])))
res_file.write_text(json.dumps({"seed": args.seed, "bound_s": args.bound_s, "runs": runs,
                                "commands": prev.get("commands", []) + [dmh.command_line()]},
                               indent=1) + "\n")
print(f"{sum(r['expected'] for r in results)} of {len(results)} runs as expected; logs in {work}")
