"""Turns compare_peers.py's JSON into the markdown section of docs/PERFORMANCE.md and a PNG."""
import argparse
import json
import re

BEGIN, END = "<!-- compare-peers:begin -->", "<!-- compare-peers:end -->"
ORDER = ["Lockbox vault", "Lockbox on Secret Service", "libsecret (C)", "secret-tool (libsecret)",
         "Python keyring (SecretService)", "keyrings.cryptfile", "kernel keyring (floor)", "raw SQLite (floor)"]


def fmt(us):
    return f"{us / 1000:.1f} ms" if us >= 1000 else f"{us:.1f} µs"


def section(data, command, machine):
    rows = {(r["peer"], r["mode"]): r for r in data["results"]}
    lines = [BEGIN, "", "## Side by side with the peers", "",
             f"Reproduce: `{command}` (about ten minutes; it starts its own private Secret Service and removes what it stored).",
             f"Measured on {machine}.", "",
             f"Workload: store {data['count']:,} small secrets (service + account -> a 37-byte value), then read each back. "
             "*In-process*: one process does every operation (timed inside it); *per process*: one new process per "
             "operation (wall clock from fork to exit, as a script or a git/docker helper sees it). Medians; "
             "the ratio is the peer's median over Lockbox vault's in the same mode (above 1: Lockbox is faster). "
             f"Fewer operations where a peer is very slow (the operations column): Python keyring per process "
             f"starts an interpreter each time ({data['slow_count']} operations), and keyrings.cryptfile runs Argon2id "
             f"on every operation, about a second here ({data['cryptfile_count']} operations in both modes). The Secret Service is gnome-keyring-daemon with an unlocked login collection "
             "on a private D-Bus session.", ""]
    for mode in ["in-process", "per process"]:
        base = rows[("Lockbox vault", mode)]
        lines += [f"**{mode[0].upper() + mode[1:]}**", "",
                  "| peer | store p50 | read p50 | store ratio | read ratio | operations |",
                  "|---|---:|---:|---:|---:|---:|"]
        for peer in ORDER:
            r = rows.get((peer, mode))
            if not r:
                continue
            lines.append(f"| {peer} | {fmt(r['store'])} | {fmt(r['read'])} | {r['store'] / base['store']:.2f}x "
                         f"| {r['read'] / base['read']:.2f}x | {r['operations']:,} |")
        lines.append("")
    inproc = rows[("Lockbox vault", "in-process")]["read"]
    libsecret = rows[("libsecret (C)", "in-process")]["read"]
    cli = rows[("Lockbox vault", "per process")]["read"]
    tool = rows[("secret-tool (libsecret)", "per process")]["read"]
    lines += ["Against the targets:", "",
              "| target | measured | met |", "|---|---|---|",
              f"| in-process read at least 50x faster than libsecret in-process | {fmt(inproc)} vs {fmt(libsecret)}: "
              f"{libsecret / inproc:.0f}x | {'yes' if libsecret / inproc >= 50 else 'no'} |",
              f"| `lockbox find-generic-password -w` (new process) at least 3x faster than `secret-tool lookup` | "
              f"{fmt(cli)} vs {fmt(tool)}: {tool / cli:.1f}x | {'yes' if tool / cli >= 3 else 'no'} |", "",
              "",
              f"A new `lockbox` process costs {fmt(data['lockbox_version_process_us'])} before it does anything "
              f"(`lockbox --version`, median of {data['count']:,}): exec, mapping the binary, the dynamic loader (libc, "
              f"libm and libstdc++, which the statically linked Swift runtime needs) and the runtime's start "
              f"(docs/PERFORMANCE.md, \"Process start\"). "
              f"`find-generic-password -w` adds {fmt(cli - data['lockbox_version_process_us'])} to that.", "",
              "![Latency per operation, log scale](peers.png)", "", END]
    return "\n".join(lines)


def chart(data, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    rows = {(r["peer"], r["mode"]): r for r in data["results"]}
    fig, axes = plt.subplots(1, 2, figsize=(13, 5.8), sharey=True)
    peers = [p for p in ORDER if any((p, m) in rows for m in ["in-process", "per process"])]
    for axis, mode in zip(axes, ["in-process", "per process"]):
        y = range(len(peers))
        for offset, (op, color) in zip([-0.2, 0.2], [("store", "#d08c3c"), ("read", "#2f6fae")]):
            values = [rows[(p, mode)][op] if (p, mode) in rows else 0 for p in peers]
            bars = axis.barh([i + offset for i in y], values, height=0.38, color=color, label=op)
            for bar, value in zip(bars, values):
                if value:
                    axis.text(value * 1.08, bar.get_y() + bar.get_height() / 2, fmt(value), va="center", fontsize=8)
        axis.set_xscale("log")
        axis.set_xlim(1, 2e7)
        axis.set_yticks(list(y))
        axis.set_yticklabels(peers)
        axis.set_xlabel("median latency per operation (µs, log scale)")
        axis.set_title({"in-process": "in-process", "per process": "one new process per operation"}[mode])
        axis.grid(axis="x", which="major", alpha=0.3)
        axis.legend(loc="lower right")
    axes[0].invert_yaxis()  # shared y axis: inverting once puts Lockbox on top in both panels
    fig.suptitle(f"Store and read a small secret: Lockbox and its peers (lower is better; medians of "
                 f"{data['count']:,} operations, fewer for the slowest peers: see docs/PERFORMANCE.md)", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--json", required=True)
    parser.add_argument("--markdown", required=True, help="file whose marked section is replaced (or appended)")
    parser.add_argument("--png", required=True)
    parser.add_argument("--command", required=True)
    parser.add_argument("--machine", required=True)
    args = parser.parse_args()
    data = json.load(open(args.json))
    text = open(args.markdown).read()
    new = section(data, args.command.strip(), args.machine)
    if BEGIN in text:
        text = re.sub(re.escape(BEGIN) + ".*" + re.escape(END), lambda _: new, text, flags=re.S)
    else:
        text = text.rstrip("\n") + "\n\n" + new + "\n"
    open(args.markdown, "w").write(text)
    chart(data, args.png)
    print(new)


if __name__ == "__main__":
    main()
