#!/usr/bin/python3
"""verbs on soft-RoCE: fabric-bench against perftest on the same rxe device (see README.md).

Boots one QEMU guest with rdma_rxe (tools/rxe-vm.sh) and runs ROUNDS rounds, alternating,
of fabric-bench (a verbs memnode and fabric-bench in the guest) and perftest's ib_read_lat
(512 B) and ib_atomic_lat (FETCH_AND_ADD, CMP_AND_SWAP). Reports medians over the rounds of
each p50 (perftest's t_typical is its median), the ratio fabric-bench / perftest, the
memnode's process CPU over each fabric-bench run, and the operations per doorbell of the
batched READ rows. Criterion: ratios <= 1.5 for the 512 B READ and the 8 B atomics.

  experiments/verbs_rxe/run.py [--rounds 5] [--iters 3000] [--build build]
"""
import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent

ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
ap.add_argument("--rounds", type=int, default=5, help="rounds (default %(default)s)")
ap.add_argument("--iters", type=int, default=3000, help="serial operations per latency point (default %(default)s)")
ap.add_argument("--build", default="build", help="build directory, relative to the repository (default %(default)s)")
ap.add_argument("--out", default=str(HERE), help="where results.json and results.md go (default: here)")
args = ap.parse_args()

bin_dir = ROOT / args.build / "bin"
with tempfile.TemporaryDirectory(prefix="verbs-rxe-") as w:
    cmd = [str(ROOT / "tools/rxe-vm.sh"), "--share", w, "--timeout", str(300 + 120 * args.rounds), "--",
           "bash", str(HERE / "guest_rounds.sh"), str(bin_dir), w, str(args.rounds), str(args.iters)]
    print("$", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)
    w = Path(w)

    def perftest_typical(name):
        # "#bytes #iterations t_min t_max t_typical t_avg ..."
        return float((w / name).read_text().split()[4])

    rounds = []
    for r in range(1, args.rounds + 1):
        fb = json.loads((w / f"fabric-bench-{r}.json").read_text())
        read512 = next(x for x in fb["read_latency"] if x["bytes"] == 512)
        batched = [t for t in fb["read_throughput"] if t["batch"] > 1]
        rounds.append({
            "fabric_bench": {"read_512_p50_us": read512["p50_us"],
                             "fetch_add_p50_us": fb["fetch_add_latency"]["p50_us"],
                             "compare_swap_p50_us": fb["compare_swap_latency"]["p50_us"],
                             "write_512_p50_us": fb["write_512_latency"]["p50_us"],
                             "memnode_cpu_s": fb["memnode_cpu_s"], "wall_s": fb["wall_s"],
                             "ops": fb["ops"],
                             "ops_per_doorbell_batched": {f'{t["bytes"]}B x{t["batch"]}': t["ops"] / t["doorbells"]
                                                          for t in batched}},
            "perftest": {"read_512_typical_us": perftest_typical(f"ib_read_lat-{r}.txt"),
                         "fetch_add_typical_us": perftest_typical(f"ib_atomic_lat-fadd-{r}.txt"),
                         "compare_swap_typical_us": perftest_typical(f"ib_atomic_lat-cas-{r}.txt")},
        })

med = lambda xs: statistics.median(xs)  # noqa: E731
rows = []
for label, ours, theirs in [("READ 512 B", "read_512_p50_us", "read_512_typical_us"),
                            ("FETCH_ADD 8 B", "fetch_add_p50_us", "fetch_add_typical_us"),
                            ("COMPARE_SWAP 8 B", "compare_swap_p50_us", "compare_swap_typical_us")]:
    a = med([r["fabric_bench"][ours] for r in rounds])
    b = med([r["perftest"][theirs] for r in rounds])
    a_min = min(r["fabric_bench"][ours] for r in rounds)
    b_min = min(r["perftest"][theirs] for r in rounds)
    rows.append({"op": label, "fabric_bench_p50_us": a, "perftest_p50_us": b, "ratio": a / b,
                 "best_round_ratio": a_min / b_min,
                 "fabric_bench_all": [r["fabric_bench"][ours] for r in rounds],
                 "perftest_all": [r["perftest"][theirs] for r in rounds]})
cpu = [r["fabric_bench"]["memnode_cpu_s"] for r in rounds]
wall = [r["fabric_bench"]["wall_s"] for r in rounds]
ops = [r["fabric_bench"]["ops"] for r in rounds]
bells = rounds[0]["fabric_bench"]["ops_per_doorbell_batched"]
result = {"rounds": args.rounds, "iters": args.iters, "rows": rows, "memnode_cpu_s": cpu, "wall_s": wall, "ops": ops,
          "ops_per_doorbell_batched": bells, "per_round": rounds}
out = Path(args.out)
(out / "results.json").write_text(json.dumps(result, indent=2) + "\n")
md = ["| operation | fabric-bench p50 (µs), median of rounds | perftest p50 (µs), median of rounds | ratio | "
      "ratio of the best rounds | fabric-bench p50 per round | perftest p50 per round |", "|---|---|---|---|---|---|---|"]
for x in rows:
    per = lambda v: " ".join(f"{y:.0f}" for y in v)  # noqa: E731
    md.append(f'| {x["op"]} | {x["fabric_bench_p50_us"]:.1f} | {x["perftest_p50_us"]:.1f} | {x["ratio"]:.2f} | '
              f'{x["best_round_ratio"]:.2f} | {per(x["fabric_bench_all"])} | {per(x["perftest_all"])} |')
md.append("")
md.append(f"memnode process CPU per fabric-bench run: {', '.join(f'{c:.3f} s' for c in cpu)} "
          f"in {', '.join(f'{x:.1f} s' for x in wall)} ({', '.join(str(o) for o in ops)} operations)")
md.append("")
md.append("operations per doorbell, batched READ rows: " + ", ".join(f"{k}: {v:.1f}" for k, v in bells.items()))
(out / "results.md").write_text("\n".join(md) + "\n")
print("\n".join(md))
ok = all(x["ratio"] <= 1.5 for x in rows)
print("criterion (every ratio <= 1.5):", "met" if ok else "NOT met")
