"""Building the Elastic GPU image on the machine, without a registry (devcluster.egpu_image).

    .venv/bin/python bench/egpu_image_build.py [--runs 3]

Prints, as a Markdown table, the median wall time of `egpu_image()` (collect the interpreter,
the standard library, the package's runtime closure and their libraries; write the one-layer
docker-archive in memory), the archive's size, its file count, and whether two builds give the
same bytes (the image ID only changes with its content).
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import statistics
import tarfile
import time

from elastic_gpu.devcluster.egpu_image import egpu_image


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    walls, digests = [], set()
    archive = b""
    for _ in range(args.runs):
        start = time.perf_counter()
        _ref, archive = egpu_image()
        walls.append(time.perf_counter() - start)
        digests.add(hashlib.sha256(archive).hexdigest())
    with tarfile.open(fileobj=io.BytesIO(archive)) as outer:
        manifest = json.loads(outer.extractfile("manifest.json").read())  # type: ignore[union-attr]
        with tarfile.open(fileobj=outer.extractfile(manifest[0]["Layers"][0])) as layer:
            files = sum(1 for m in layer.getmembers() if m.isfile())
    print("| what | median | runs |\n|---|---:|---:|")
    print(f"| build (wall) | {statistics.median(walls):.1f} s | {args.runs} |")
    print(f"| archive | {len(archive) / 2**20:.0f} MiB, {files} files | |")
    print(f"| reproducible | {'yes' if len(digests) == 1 else 'NO'} | |")


if __name__ == "__main__":
    main()
