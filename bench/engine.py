#!/usr/bin/env python3
"""`densefs bench engine` on the FASTQ corpus and an incompressible file, for every backend the
machine has (or those given), written to bench/results/engine-LABEL.{json,md} with the machine
named (CPU model and cores; GPU model when nvidia-smi is there).

    bench/engine.py --label h100 [--bin target/release/densefs] [--backend all] FASTQ RANDOM
    bench/engine.py --label h100 --from-json --repeat 2 FASTQ.json RANDOM.json   (outputs of `--json` runs)
"""
import argparse
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

ALGS = "lz4,gzip-1,gzip-6,gzip-9,zstd-3"


def machine():
    cpu = "?"
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    gpu = None
    try:
        gpu = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        pass
    return {"cpu": cpu, "cores": os.cpu_count(), "gpu": gpu, "kernel": platform.release()}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--label", required=True)
    ap.add_argument("--bin", default="target/release/densefs")
    ap.add_argument("--backend", default="all")
    ap.add_argument("--compression", default=ALGS)
    ap.add_argument("--repeat", default="3")
    ap.add_argument("--size", help="repeat each file's records up to this size (e.g. 1G)")
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"))
    ap.add_argument("--from-json", action="store_true", help="the files are `densefs bench engine --json` outputs")
    ap.add_argument("files", nargs="+")
    a = ap.parse_args()
    runs = []
    for f in a.files:
        if a.from_json:
            try:
                runs.append(json.loads(Path(f).read_text()))
            except (OSError, ValueError) as e:
                print(f"skipped {f}: {e}", file=sys.stderr)
            continue
        cmd = [a.bin, "bench", "engine", "--backend", a.backend, "--compression", a.compression,
               "--repeat", a.repeat, "--json", f] + (["--size", a.size] if a.size else [])
        print("+", " ".join(cmd), file=sys.stderr, flush=True)
        p = subprocess.run(cmd, capture_output=True, text=True)
        sys.stderr.write(p.stderr)
        if p.returncode != 0:
            sys.exit(f"bench engine failed on {f}")
        runs.append(json.loads(p.stdout))
    result = {"label": a.label, "machine": machine(), "runs": runs}
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"engine-{a.label}.json").write_text(json.dumps(result, indent=1))
    m = result["machine"]
    md = [f"# `densefs bench engine` — {a.label}\n",
          f"Machine: {m['cpu']}, {m['cores']} cores" + (f"; GPU: {m['gpu']}" if m["gpu"] else "; no GPU") +
          f"; kernel {m['kernel']}. Records of 128 KiB, min_savings 12.5%, pre-check on; each row the "
          f"fastest of {a.repeat} runs. GB/s are logical (uncompressed) bytes per second; CPU s/GB is the "
          f"whole process's user+system time per logical GB; offloaded is the share of records the "
          f"backend itself compressed (the rest fell back to the CPU, reasons in the JSON).\n"]
    for run in runs:
        md.append(f"## {Path(run['file']).name} ({run['bytes'] / 1e6:.0f} MB, {run['cpu_threads']} CPU threads)\n")
        md.append("| backend | algorithm | compress GB/s | decompress GB/s | ratio | compress CPU s/GB | decompress CPU s/GB | offloaded |")
        md.append("|---|---|---:|---:|---:|---:|---:|---:|")
        for r in run["rows"]:
            md.append(f"| {r['backend']} | {r['algorithm']} | {r['compress_gbps']:.3f} | {r['decompress_gbps']:.3f} | "
                      f"{r['ratio']:.2f} | {r['compress_cpu_s_per_gb']:.2f} | {r['decompress_cpu_s_per_gb']:.2f} | "
                      f"{r['offloaded'] * 100:.0f}% |")
        md.append("")
    (out / f"engine-{a.label}.md").write_text("\n".join(md))
    print("\n".join(md))


if __name__ == "__main__":
    main()
