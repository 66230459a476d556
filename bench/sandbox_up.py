"""`egpu sandbox up --gpu-nodes N` as a user runs it (the default: the whole system), and `down`.

    .venv/bin/python bench/sandbox_up.py [--runs 3] [--nodes 100] [--bare]

Each run: `egpu sandbox up --gpu-nodes N` end to end (the CLI's own Python start-up included)
until every node is Ready and the Elastic GPU scheduler extender knows every node's cards
(what `up` waits for; checked again here against the extender's /metrics), then `egpu sandbox
down`, then a check that nothing of it is left (no process naming the state dir, no listening
port). Prints the medians as a Markdown table, with the median of each step of `up` (from the
`up_seconds` it records in state.json).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import urllib.request
from pathlib import Path

from egpu_testing.sandbox import timed_egpu
from elastic_gpu.devcluster.components import extender_missing_nodes
from elastic_gpu.devcluster.nodes import uniform_inventories
from elastic_gpu.devcluster.ports import is_listening
from elastic_gpu.devcluster.sandbox import processes_using


def one_run(nodes: int, bare: bool) -> tuple[float, float, dict[str, float]]:
    with tempfile.TemporaryDirectory(prefix="egpu-bench-sandbox-") as tmp:
        state, kc = Path(tmp) / "state", Path(tmp) / "kubeconfig"
        up, _ = timed_egpu("sandbox", "up", "--gpu-nodes", str(nodes), "--kubeconfig", str(kc),
                           "--state-dir", str(state), *(["--bare"] if bare else []))
        saved = json.loads((state / "state.json").read_text())
        ports = [saved["plane"][k] for k in ("apiserver_port", "etcd_port", "etcd_peer_port",
                                             "kwok_port", "controller_manager_port")]
        ports += [c["port"] for c in saved["components"].values() if c["port"]]
        if not bare:
            url = saved["components"]["egpu-scheduler"]["endpoint"]
            with urllib.request.urlopen(f"{url}/metrics", timeout=10) as response:
                text = response.read().decode()
            missing = extender_missing_nodes(
                text, {inv.name: len(inv.cards) for inv in uniform_inventories(nodes)})
            if missing:
                raise SystemExit(f"up returned before the extender knew {missing[:5]}")
        down, _ = timed_egpu("sandbox", "down", "--state-dir", str(state))
        left = processes_using(state.resolve())
        listening = [p for p in ports if p and is_listening(p)]
        if left or listening:
            raise SystemExit(f"down left processes {left} / ports {listening}")
        return up, down, saved.get("up_seconds", {})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--nodes", type=int, default=100)
    parser.add_argument("--bare", action="store_true", help="time `up --bare` instead")
    parser.add_argument("--json", type=Path, help="also write the raw timings here")
    args = parser.parse_args()

    runs = [one_run(args.nodes, args.bare) for _ in range(args.runs)]
    flag = " --bare" if args.bare else ""
    rows = [(f"`egpu sandbox up{flag} --gpu-nodes {args.nodes}` (nodes Ready"
             f"{'' if args.bare else ', extender knows them'})", [r[0] for r in runs]),
            ("`egpu sandbox down` (nothing left)", [r[1] for r in runs])]
    steps = list(runs[0][2])
    rows += [(f"  up step: {name}", [r[2].get(name, 0.0) for r in runs]) for name in steps]
    print(f"| what | median s (of {args.runs}) | runs s |")
    print("|---|---|---|")
    for what, values in rows:
        print(f"| {what} | {statistics.median(values):.2f} | "
              f"{', '.join(f'{v:.2f}' for v in values)} |")
    if args.json:
        args.json.write_text(json.dumps([{"up": r[0], "down": r[1], "steps": r[2]}
                                         for r in runs], indent=2))


if __name__ == "__main__":
    main()
