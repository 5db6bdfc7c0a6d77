"""What finding the ``toolkit`` plugins costs, and how it grows with installed distributions.

    python bench/bench_plugin_discovery.py                  # this environment, 7 fresh processes a mode
    python bench/bench_plugin_discovery.py --fake 400       # + 400 fake distributions on PYTHONPATH

Each run is a fresh interpreter that imports torch first (as a load's process has: torch's own
import reads entry points and warms importlib.metadata), then times what
``PluginSet.load_entry_points`` does before importing any plugin: the ``toolkit`` group's entry
points and each plugin distribution's name and version. Modes: ``before`` (the code before
core/entry_point_scan.py: importlib.metadata's entry_points, then each distribution's whole METADATA
parsed), ``importlib`` (``TOOLKIT_PLUGIN_SCAN=0``: importlib.metadata's entry_points, METADATA's
header block) and ``scan`` (core/entry_point_scan.py, the default). ``--fake N``
writes N distributions like pip's (METADATA with a long description, RECORD, WHEEL,
top_level.txt; every third with console_scripts and pytest11 entry points, none in ``toolkit``)
to a temporary directory put first on PYTHONPATH. The plugins phase of a whole load, imports
included, is bench/bench_load_phases.py's (run it with the same PYTHONPATH and switch).
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile

WORKER = r"""
import sys, time
import torch
import importlib.metadata as md
from toolkit.core.entry_point_scan import entry_points, name_and_version
start = time.perf_counter()
if sys.argv[1] == "before":  # the code before core/entry_point_scan.py: whole METADATA parsed
    found = [(ep, ep.dist) for ep in md.entry_points(group="toolkit")]
    dists = {}
    for _, dist in found:
        if id(dist) not in dists:
            metadata = dist.metadata
            dists[id(dist)] = (metadata["Name"], metadata["Version"])
else:
    found = entry_points("toolkit")
    dists = {}
    for _, dist in found:
        if id(dist) not in dists:
            dists[id(dist)] = name_and_version(dist)
print(len(found), len(dists), time.perf_counter() - start)
"""


def write_fake(root: str, count: int) -> None:
    body = "A line of a long description.\n" * 200
    for i in range(count):
        name = f"fake_pkg_{i:04d}"
        info = os.path.join(root, f"{name}-1.{i}.0.dist-info")
        os.makedirs(info)
        files = {"METADATA": f"Metadata-Version: 2.1\nName: fake-pkg-{i:04d}\nVersion: 1.{i}.0\n\n{body}",
                 "RECORD": "".join(f"{name}/m{j}.py,sha256=x,100\n" for j in range(50)),
                 "WHEEL": "Wheel-Version: 1.0\n", "top_level.txt": f"{name}\n"}
        if i % 3 == 0:
            files["entry_points.txt"] = f"[console_scripts]\n{name} = {name}.cli:main\n\n[pytest11]\n{name} = {name}.p\n"
        for file, text in files.items():
            with open(os.path.join(info, file), "w") as handle:
                handle.write(text)


def distribution_count(env: dict) -> int:
    code = "import importlib.metadata as m; print(len(list(m.distributions())))"
    return int(subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                              check=True).stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--fake", type=int, default=0, help="fake distributions to add (default none)")
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as fake:
        env = dict(os.environ)
        if args.fake:
            write_fake(fake, args.fake)
            env["PYTHONPATH"] = os.pathsep.join(filter(None, [fake, env.get("PYTHONPATH")]))
        print(f"{distribution_count(env)} distributions on sys.path; median of {args.repeat} fresh processes")
        for mode, switch in (("before", "1"), ("importlib", "0"), ("scan", "1")):
            runs = [subprocess.run([sys.executable, "-c", WORKER, mode], env=dict(env, TOOLKIT_PLUGIN_SCAN=switch),
                                   capture_output=True, text=True, check=True).stdout.split()
                    for _ in range(args.repeat)]
            seconds = [float(run[2]) for run in runs]
            print(f"  {mode:<10} {statistics.median(seconds) * 1e3:6.2f} ms (min {min(seconds) * 1e3:.2f}): "
                  f"{runs[0][0]} entry points from {runs[0][1]} distribution(s)")


if __name__ == "__main__":
    main()
