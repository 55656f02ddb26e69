#!/usr/bin/python3
"""Soak: both modes under a mixed workload for an hour, sampled each minute (see README.md).

Two clusters over tcp with a cluster token, on loopback:
- d-HNSW: 2 memnodes; bigann10k (10,000 SIFT vectors) built with gaps; a querier computenode
  that runs the whole time (one process, its per-batch timeline gives latency by minute).
- shine: 2 memnodes; bigann10k.
Rounds back to back until the time is up: a d-HNSW computenode joins, inserts 150 new vectors
(a Gaussian pool far from the SIFT queries, so the ground truth stays true) while it answers
queries (--mix), and leaves; the gaps run out and online rebuilds happen. Then 2 shine
computenodes join, answer 400 queries with a node cache and adaptive routing through the
relay, and leave. Each minute a sampler thread reads every long-lived process (the 4 memnodes, the
querier): RSS, the RSS outside the memnode's region mapping, open fds, threads.
The binaries are copied first, so a rebuild of build/ during the hour changes nothing.

With --replicas R each memnode id is a replica set of R copies (docs/replication.md), and with
--kill-every M a killer thread, every M minutes, SIGKILLs one random copy of one of the two
clusters (in turn), starts a new `memnode --rejoin` at its address after --replace-after seconds
and fills it with `computenode rejoin`, while the rounds and the querier go on; each such event
(what was killed, the rejoin's report) is recorded, and any failed round is a failure as before.

  experiments/soak/run.py [--minutes 60] [--replicas 2 --kill-every 10] [--out experiments/soak]
"""
import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import dmh  # noqa: E402
import minutes  # noqa: E402  (this folder: run as a script, it is on sys.path)

HERE = Path(__file__).resolve().parent
BIG = dmh.DATA / "bigann10k"
ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
ap.add_argument("--minutes", type=float, default=60)
ap.add_argument("--inserts-per-minute", type=int, default=150, help="inserts per round")
ap.add_argument("--replicas", type=int, default=1, help="copies per memnode id (replica sets)")
ap.add_argument("--kill-every", type=float, default=0,
                help="minutes between SIGKILLs of a random memnode copy, each replaced and rejoined (needs --replicas >= 2)")
ap.add_argument("--replace-after", type=float, default=20, help="seconds a killed copy stays dead before its replacement")
ap.add_argument("--out", default=str(HERE))
args = ap.parse_args()
if args.kill_every > 0 and args.replicas < 2:
    ap.error("--kill-every needs --replicas 2 or more (with one copy a kill loses the index)")

work = Path(tempfile.mkdtemp(prefix="dmh-soak-"))
(work / "bin").mkdir()
for b in ("memnode", "computenode", "workload", "datagen"):
    shutil.copy2(dmh.BIN / b, work / "bin" / b)
dmh.BIN = work / "bin"
os.environ["DMHNSW_TOKEN"] = "soak-" + os.urandom(8).hex()  # memnodes and computenodes read it
PROVIDER = "tcp"

base, queries, gt = BIG / "bigann10k_base.bvecs", BIG / "bigann10k_query.fvecs", BIG / "bigann10k_groundtruth.ivecs"
wl = work / "q.wl"
dmh.run([dmh.BIN / "workload", "--queries", queries, "--groundtruth", gt, "--dist", "uniform", "--count", 2000,
         "--warmup", 0, "--seed", 1, "--out", wl])
wl_shine = work / "q400.wl"  # a shine round answers 400 queries, however slow the host
dmh.run([dmh.BIN / "workload", "--queries", queries, "--groundtruth", gt, "--dist", "uniform", "--count", 400,
         "--warmup", 0, "--seed", 2, "--out", wl_shine])
# The inserted vectors: 2 x per round (computenode 1 of 2 inserts rows i % 2 == 1); a round
# takes 20 s or more on this host.
pool = work / "pool.fvecs"
pool_rows = int(2 * args.inserts_per_minute * (3 * args.minutes + 3))
dmh.run([dmh.BIN / "datagen", "--n", pool_rows, "--d", 128, "--clusters", 64,
         "--queries", 0, "--seed", 7, "--out-base", pool])


def cn(mn, mode, cn_id, num, *rest):
    return [str(x) for x in [dmh.BIN / "computenode", "--mode", mode, "--provider", PROVIDER, "--memnodes", mn.list,
                             "--cn-id", cn_id, "--num-cns", num, *rest]]


def proc_sample(pid, region_bytes=None):
    """RSS, RSS outside the region mapping (memnodes), fds and threads of a live process."""
    st = Path(f"/proc/{pid}/status").read_text()
    kb = {l.split(":")[0]: int(l.split()[1]) for l in st.splitlines() if l.split(":")[0] in ("VmRSS", "Threads")}
    rss = kb["VmRSS"] * 1024
    region_rss = 0
    if region_bytes:
        cur = None
        for line in Path(f"/proc/{pid}/smaps").read_text().splitlines():
            head = line.split()
            if "-" in head[0] and len(head) >= 5 and ":" not in head[0]:
                lo, hi = (int(x, 16) for x in head[0].split("-"))
                cur = hi - lo
            elif head[0] == "Rss:" and cur is not None and cur >= region_bytes:
                region_rss += int(head[1]) * 1024
    return {"rss": rss, "own_rss": rss - region_rss, "fds": len(os.listdir(f"/proc/{pid}/fd")),
            "threads": kb["Threads"]}


REGION = {"dhnsw": 1 << 30, "shine": 512 << 20}
samples, rounds_out, failures = [], [], []
t_start = time.time()
kills = []
with dmh.Memnodes(2, PROVIDER, "1GiB", work / "mn-dhnsw", replicas=args.replicas) as mnd, \
        dmh.Memnodes(2, PROVIDER, "512MiB", work / "mn-shine", replicas=args.replicas) as mns:
    dmh.log("building both indexes")
    dmh.run(cn(mnd, "dhnsw", 0, 1, "build", "--data", base, "--metric", "l2", "--partitions", 20, "--internal-gap", 0.2,
               "--overflow-gap", 0.2, "--report", work / "dhnsw-build.json"))
    dmh.run(cn(mns, "shine", 0, 1, "build", "--data", base, "--metric", "l2", "--m", 16, "--ef-construction", 100,
               "--threads", 2, "--report", work / "shine-build.json"))
    qlog = open(work / "querier.log", "w")
    querier = subprocess.Popen(cn(mnd, "dhnsw", 0, 1, "query", "--workload", wl, "--batch", 200, "--probe", 4,
                                  "--threads", 1, "--mix", "insert:0", "--repeat-seconds", args.minutes * 60,
                                  "--report", work / "querier.json"), stdout=qlog, stderr=qlog)
    t0 = time.time()
    R = args.replicas

    def procs_now():
        """The long-lived processes now (a replaced memnode is sampled under its copy's name)."""
        name = (lambda i: f"{i}") if R == 1 else (lambda i: f"{i // R} copy {i % R}")
        out = {f"dhnsw memnode {name(i)}": (p, REGION["dhnsw"]) for i, p in enumerate(mnd.procs)}
        out.update({f"shine memnode {name(i)}": (p, REGION["shine"]) for i, p in enumerate(mns.procs)})
        out["dhnsw querier"] = (querier, None)
        return out

    done = threading.Event()
    replacing = set()  # physical memnodes killed and not yet replaced: not sampled, not a failure

    def killer():
        """Every --kill-every minutes: a random copy of one cluster (in turn) SIGKILLed, replaced
        after --replace-after s by a new memnode at its address, filled by `computenode rejoin`."""
        k = 0
        # 30 s past the minute: not at the instant the sampler reads every process
        while not done.wait(max(0.0, t0 + 60 * args.kill_every * (k + 1) + 30 - time.time())):
            if time.time() > t0 + args.minutes * 60 - 120:  # no kill the run cannot see through
                return
            mn, mode = (mnd, "dhnsw") if k % 2 == 0 else (mns, "shine")
            i = random.Random(k).randrange(len(mn.procs))
            ev = {"n": k, "cluster": mode, "memnode": i // R, "copy": i % R, "killed_at_s": time.time() - t0}
            replacing.add((mode, i))
            mn.kill(i)
            dmh.log(f"killer: SIGKILL of {mode} memnode {i // R} copy {i % R}")
            if done.wait(args.replace_after):
                return
            try:
                mn.replace(i)
                ev["replaced_at_s"] = time.time() - t0
                rep = work / f"rejoin{k}.json"
                p = subprocess.run(cn(mn, mode, 3, 4, "rejoin", "--memnode", i // R, "--copy", i % R, "--report", rep),
                                   capture_output=True, text=True, timeout=600)
                ev["rejoin_code"] = p.returncode
                if p.returncode == 0:
                    r = json.loads(Path(f"{rep}.cn3").read_text())  # computenode i > 0 writes REPORT.cn<i>
                    ev["rejoin"] = {x: r.get(x) for x in ("first_pass_gbytes_per_s", "frozen_ms", "passes",
                                                          "recopied_bytes", "seconds")}
                else:
                    failures.append({"what": f"rejoin of {mode} memnode {i // R} copy {i % R}",
                                     "code": p.returncode, "tail": (p.stdout + p.stderr)[-2000:]})
            except (RuntimeError, subprocess.TimeoutExpired) as e:
                failures.append({"what": f"replacing {mode} memnode {i // R} copy {i % R}", "tail": str(e)[-2000:]})
            finally:
                replacing.discard((mode, i))
            ev["rejoined_at_s"] = time.time() - t0
            kills.append(ev)
            dmh.log(f"killer: {json.dumps(ev)}")
            k += 1

    def sampler():
        """Every minute: each long-lived process's memory, fds and threads."""
        while not done.wait(max(0.0, t0 + 60 * (len(samples) + 1) - time.time())):
            row = {"minute": len(samples) + 1, "t_s": time.time() - t0, "load": os.getloadavg()[0], "procs": {}}
            dying = {proc for mode, i in list(replacing) for proc in [(mnd if mode == "dhnsw" else mns).procs[i]]}
            for name, (proc, region) in procs_now().items():
                try:
                    if proc is querier and proc.poll() == 0:  # its time is up: not a failure
                        continue
                    if proc in dying:  # killed on purpose, its replacement not started yet
                        continue
                    if proc.poll() is not None:
                        raise OSError("exited")
                    row["procs"][name] = proc_sample(proc.pid, region)
                except (OSError, KeyError):
                    failures.append({"minute": row["minute"], "what": f"{name} is gone"})
            samples.append(row)
            dmh.log(f"minute {row['minute']}: " + ", ".join(f"{k} {v['own_rss'] >> 20} MiB/{v['fds']} fds"
                                                           for k, v in row["procs"].items()))

    st = threading.Thread(target=sampler, daemon=True)
    st.start()
    kt = threading.Thread(target=killer, daemon=True)
    if args.kill_every > 0:
        kt.start()
    r = 0
    while time.time() < t0 + args.minutes * 60 - 30 and 2 * args.inserts_per_minute * (r + 1) <= pool_rows:
        row = {"round": r, "t_s": time.time() - t0}
        # d-HNSW: a computenode inserts this round's vectors while it answers queries, then leaves.
        lo = 2 * args.inserts_per_minute * r
        rep = work / f"mixed{r}.json"
        p = subprocess.run(cn(mnd, "dhnsw", 1, 2, "query", "--workload", wl, "--batch", 200, "--probe", 4,
                              "--threads", 1, "--mix", "insert:0.05", "--insert-data", pool, "--insert-begin", lo,
                              "--insert-end", lo + 2 * args.inserts_per_minute, "--insert-id-offset", 1000000,
                              "--report", rep), capture_output=True, text=True)
        if p.returncode == 0:
            m = json.loads(Path(f"{rep}.cn1").read_text())  # computenode i > 0 writes REPORT.cn<i>
            row["dhnsw"] = {"recall": m["search"]["recall"], "batch_p50_ms": m["batch_ms"]["p50"],
                            "batch_p99_ms": m["batch_ms"]["p99"], "inserts": m["insert"]["inserted"],
                            "rebuilds": m["insert"]["rebuilds"],
                            "epoch": m["timeline"][-1][5] if m["timeline"] else None}
        else:
            failures.append({"round": r, "what": "dhnsw mixed", "code": p.returncode,
                             "tail": (p.stdout + p.stderr)[-2000:]})
        # shine: two computenodes join, query with a cache and adaptive routing, leave.
        try:
            s, _ = dmh.computenodes(mns, PROVIDER, 2, "query",
                                    ["--workload", wl_shine, "--ef-search", 64, "--threads", 1, "--cache-ratio", 0.05,
                                     "--routing", "adaptive", "--route-batch", 50, "--route-threshold", 100],
                                    work / f"shine{r}.json", logdir=work / f"shine{r}", timeout=300)
            run0 = s["runs"][0]
            row["shine"] = {"recall": run0["recall"], "qps": run0["qps"], "p50_us": run0["latency_us"]["p50"],
                            "p99_us": run0["latency_us"]["p99"]}
        except RuntimeError as e:
            failures.append({"round": r, "what": "shine query", "tail": str(e)[-2000:]})
        row["end_s"] = time.time() - t0
        rounds_out.append(row)
        dmh.log(f"round {r}: " + json.dumps(row))
        (work / "rounds.json").write_text(json.dumps(rounds_out, indent=1))
        r += 1
    querier.wait(timeout=600)
    done.set()
    st.join()
    if kt.is_alive():
        kt.join()
    qlog.close()
    q = json.loads((work / "querier.json").read_text()) if querier.returncode == 0 else None  # a mixed report
    if q is not None:  # every batch stays in the work dir's querier.json; results.json keeps minutes
        q["timeline_by_minute"] = {"fields": minutes.FIELDS, "rows": minutes.by_minute(q)}
        del q["timeline"]
    else:
        failures.append({"what": "dhnsw querier", "code": querier.returncode,
                         "tail": (work / "querier.log").read_text()[-2000:]})
    memnode_errors = {f"{d.name}/{log.stem}": sum(1 for l in log.read_text().splitlines() if "[error]" in l)
                      for d in (work / "mn-dhnsw", work / "mn-shine") for log in sorted(d.glob("memnode*.log"))}

result = {"minutes": args.minutes, "rounds": rounds_out, "provider": PROVIDER, "inserts_per_minute": args.inserts_per_minute,
          "replicas": args.replicas, "kill_every_min": args.kill_every, "kills": kills,
          "wall_s": time.time() - t_start, "samples": samples, "failures": failures,
          "querier": q, "memnode_error_lines": memnode_errors,
          "command": dmh.command_line(), "work": str(work)}
out = Path(args.out)
out.mkdir(parents=True, exist_ok=True)
name = "results.json" if args.replicas == 1 else f"results-replicas{args.replicas}.json"
(out / name).write_text(json.dumps(result, indent=1) + "\n")
print(f"{len(samples)} samples, {len(rounds_out)} rounds, {len(kills)} kills, {len(failures)} failures; "
      f"work dir {work}; {out / name}")
