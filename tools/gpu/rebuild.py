#!/usr/bin/env python3
"""Rebuilds the GPU bundle's binaries on a machine without Bazel (Note [Rebuilding the
bundle] in tools/gpu/record_build.py).

    rebuild.py BUNDLE_ROOT REPO [--jobs N]

BUNDLE_ROOT is an unpacked bundle (tessera-gpu/) holding build/ (record_build.py's output);
REPO is the repository's working tree. Runs the recorded actions in an execution root of
its own (BUNDLE_ROOT/build/execroot: the repository's folders, the recorded external
files, this machine's CUDA headers), with this machine's nvcc and CUDA library folder in
place of the recording machine's, then puts each rebuilt binary over the one in
BUNDLE_ROOT/bin and each shared library a test loads into BUNDLE_ROOT/lib, linked with the
rpaths pack.sh sets ($ORIGIN/../lib, $ORIGIN). Exit code 0 when every action
succeeded; otherwise the first failing command and its output are printed.
"""
import concurrent.futures
import json
import os
import shutil
import subprocess
import sys

RECORDED_CUDA = "/usr/local/cuda"


def cuda_home():
    """This machine's CUDA toolkit: the first of $CUDA_PATH, $CUDA_HOME, the folder above
    the nvcc on PATH (links resolved) and /usr/local/cuda that holds both bin/nvcc and
    include/cuda_runtime_api.h. The nvcc on PATH may be a wrapper script outside the
    toolkit (/usr/local/bin/nvcc running /usr/local/cuda-13.0/bin/nvcc), whose folder has
    no CUDA headers, so every candidate is checked."""
    nvcc = shutil.which("nvcc")
    candidates = [os.environ.get("CUDA_PATH"), os.environ.get("CUDA_HOME"),
                  os.path.dirname(os.path.dirname(os.path.realpath(nvcc))) if nvcc else None,
                  RECORDED_CUDA]
    tried = [c for c in candidates if c]
    for c in tried:
        if (os.path.isfile(os.path.join(c, "bin", "nvcc")) and
                os.path.isfile(os.path.join(c, "include", "cuda_runtime_api.h"))):
            return c
    sys.exit("rebuild.py: expected a CUDA toolkit (bin/nvcc and include/cuda_runtime_api.h) "
             f"in one of {', '.join(tried)}, found none (set CUDA_PATH)")


def make_execroot(root, repo, cuda):
    execroot = os.path.join(root, "build", "execroot")
    shutil.rmtree(execroot, ignore_errors=True)
    os.makedirs(execroot)
    for entry in os.listdir(repo):
        if entry.startswith(".") or entry.startswith("bazel-") or entry == "external":
            continue
        os.symlink(os.path.join(repo, entry), os.path.join(execroot, entry))
    shutil.copytree(os.path.join(root, "build", "external"), os.path.join(execroot, "external"),
                    symlinks=True)
    cuda_config = os.path.join(execroot, "external", "local_config_cuda")
    os.makedirs(cuda_config, exist_ok=True)
    os.symlink(os.path.join(cuda, "include"), os.path.join(cuda_config, "include"))
    return execroot


def adapt(argv, root, cuda):
    """The recorded command for this machine: its CUDA, the carried headers and libraries
    searched after the command's own, and the bundle's rpath (pack.sh's layout: binaries
    in bin/, libraries in lib/), so no patchelf is needed there."""
    sysinclude = os.path.join(root, "build", "sysinclude")
    linklib = os.path.join(root, "build", "linklib")
    out = [a.replace(RECORDED_CUDA, cuda) for a in argv]
    if out[0].endswith("gcc") and "-c" in out:
        out += ["-isystem", sysinclude]
    elif out[0].endswith("gcc"):
        rpath = "$ORIGIN" if "-shared" in out else "$ORIGIN/../lib"
        out += ["-L" + linklib, "-Wl,-rpath-link," + os.path.join(root, "lib"), "-Wl,-rpath," + rpath]
    return out


def link_library_names(root):
    """linklib/libX.so -> lib/libX.so.N for each carried library, so that -lX finds it."""
    linklib = os.path.join(root, "build", "linklib")
    os.makedirs(linklib, exist_ok=True)
    for name in os.listdir(os.path.join(root, "lib")):
        if ".so." in name:
            dev_name = name[: name.index(".so.") + 3]
            link = os.path.join(linklib, dev_name)
            if not os.path.lexists(link):
                os.symlink(os.path.join(root, "lib", name), link)


def run(action, execroot, root, cuda):
    for out in action["outputs"]:
        os.makedirs(os.path.dirname(os.path.join(execroot, out)), exist_ok=True)
    if "link_to" in action:
        link = os.path.join(execroot, action["outputs"][0])
        if os.path.lexists(link):
            os.remove(link)
        os.symlink(os.path.join(execroot, action["link_to"]), link)
        return 0, ["ln", "-s", action["link_to"], action["outputs"][0]], ""
    argv = adapt(action["argv"], root, cuda)
    done = subprocess.run(argv, cwd=execroot, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True)
    return done.returncode, argv, done.stdout


def install(built, folder):
    """Copies `built` (links resolved) into `folder`, over the carried file of that name."""
    target = os.path.join(folder, os.path.basename(built))
    if os.path.lexists(target):
        os.remove(target)
    shutil.copyfile(os.path.realpath(built), target)
    os.chmod(target, 0o755)


def main(root, repo, jobs):
    actions = json.load(open(os.path.join(root, "build", "actions.json")))
    cuda = cuda_home()
    execroot = make_execroot(root, repo, cuda)
    link_library_names(root)
    # Dependencies come first in the list; an action waits for those producing its inputs.
    produced_by = {out: i for i, a in enumerate(actions) for out in a["outputs"]}
    level = []
    for a in actions:
        needs = [produced_by[p] for p in a["needs"]]
        level.append(1 + max((level[n] for n in needs), default=-1))
    with concurrent.futures.ThreadPoolExecutor(jobs) as pool:
        for lvl in range(max(level, default=-1) + 1):
            batch = [a for a, l in zip(actions, level) if l == lvl]
            results = pool.map(lambda a: run(a, execroot, root, cuda), batch)
            for action, (code, argv, output) in zip(batch, results):
                if code != 0:
                    errors = [l for l in output.splitlines() if "error" in l] or [""]
                    print(f"rebuild.py: failed (exit {code}) making {action['outputs'][0]}: {errors[0]}\n"
                          f"{' '.join(argv)}\n{output}")
                    return 1
    linked = [a for a in actions if "argv" in a and a["argv"][0].endswith("gcc") and "-c" not in a["argv"]]
    binaries = [a["outputs"][0] for a in linked if "-shared" not in a["argv"]]
    # The shared libraries tests load (their _solib_k8 names) join the carried ones.
    for a in actions:
        if "link_to" in a:
            install(os.path.join(execroot, a["outputs"][0]), os.path.join(root, "lib"))
    for b in binaries:
        install(os.path.join(execroot, b), os.path.join(root, "bin"))
    print(f"rebuild.py: {len(actions)} actions, {len(binaries)} binaries rebuilt with {cuda}")
    return 0


if __name__ == "__main__":
    args = sys.argv[1:]
    jobs = os.cpu_count() or 1
    if "--jobs" in args:
        i = args.index("--jobs")
        jobs = int(args[i + 1])
        del args[i : i + 2]
    if len(args) != 2:
        sys.exit("usage: rebuild.py BUNDLE_ROOT REPO [--jobs N]")
    sys.exit(main(args[0], args[1], jobs))
