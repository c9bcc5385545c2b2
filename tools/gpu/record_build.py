#!/usr/bin/env python3
"""Records how Bazel built the GPU bundle's binaries, for tools/gpu/rebuild.py.

    record_build.py AQUERY_JSON OUT_DIR BINARY...

AQUERY_JSON is `bazel aquery --include_param_files --output=jsonproto` over the binaries'
deps; each BINARY is an output path in it (bazel-out/.../bin/tools/train). Writes to
OUT_DIR:
  actions.json  the compile, nvcc and link actions the binaries need, dependencies first:
                [{"outputs": [...], "argv": [...], "needs": [...]}, ...] ("needs": the
                inputs that earlier actions produce); a parameter file's arguments
                are in argv already (aquery expands them), so its @file is left out; a
                solib link is {"outputs": [link], "link_to": library}
  external/     every source file from an external repository those actions read
                (Eigen, Catch2, OpenMPI's headers, Bazel's genrule setup), with symbolic
                links resolved; CUDA's own headers stay the GPU machine's
  sysinclude/   the headers found on the system include path that the sources include
                and a GPU machine may lack: nlohmann, spdlog, fmt

Note [Rebuilding the bundle]
A GPU machine has nvcc and a C++ compiler but no Bazel, and its CUDA libraries may not be
the ones the carried binaries were linked against (another major version). Bazel's action
graph already holds every compiler and linker command line; recording the ones the
bundle's binaries depend on (a binary links its objects statically) lets rebuild.py run
them there in the same order, against the repository's sources (the working tree travels
with the bundle) and the headers recorded here.
"""
import json
import os
import shutil
import sys

# The actions a binary's bytes come from: compiles, nvcc genrules, archives and links, and
# the _solib_k8 links to the shared libraries that tests load. The others (runfiles trees,
# stripping, middlemen) do not feed a binary.
BUILD_MNEMONICS = {"CppCompile", "CppLink", "Genrule", "SolibSymlink"}
# System headers the sources include that Bazel does not track (they are on the
# compiler's built-in search path).
SYSTEM_HEADER_DIRS = ["/usr/include/nlohmann", "/usr/include/spdlog", "/usr/include/fmt"]


def main(aquery_json, out_dir, binaries):
    graph = json.load(open(aquery_json))
    fragments = {f["id"]: f for f in graph["pathFragments"]}

    def fragment_path(fid):
        parts = []
        while fid:
            f = fragments[fid]
            parts.append(f["label"])
            fid = f.get("parentId")
        return "/".join(reversed(parts))

    artifact_path = {a["id"]: fragment_path(a["pathFragmentId"]) for a in graph["artifacts"]}
    depsets = {d["id"]: d for d in graph["depSetOfFiles"]}
    producer = {}
    for action in graph["actions"]:
        if action["mnemonic"] in BUILD_MNEMONICS:
            for out in action.get("outputIds", []):
                producer[artifact_path[out]] = action

    expanded = {}

    def depset_files(did):
        if did not in expanded:
            d = depsets[did]
            files = [artifact_path[a] for a in d.get("directArtifactIds", [])]
            for t in d.get("transitiveDepSetIds", []):
                files.extend(depset_files(t))
            expanded[did] = files
        return expanded[did]

    def inputs_of(action):
        files = []
        for did in action.get("inputDepSetIds", []):
            files.extend(depset_files(did))
        return files

    ordered, done, sources = [], set(), set()

    def visit(path):
        action = producer.get(path)
        if action is None:
            if not path.startswith("bazel-out/"):
                sources.add(path)
            return
        key = action["actionKey"]
        if key in done:
            return
        done.add(key)
        inputs = inputs_of(action)
        for p in inputs:
            visit(p)
        outputs = [artifact_path[o] for o in action["outputIds"]]
        needs = sorted({p for p in inputs if p in producer})
        if action["mnemonic"] == "SolibSymlink":
            ordered.append({"outputs": outputs, "link_to": inputs[0], "needs": needs})
            return
        params = {"@" + p["execPath"] for p in action.get("paramFiles", [])}
        ordered.append({
            "outputs": outputs,
            "argv": [a for a in action["arguments"] if a not in params],
            "needs": needs,
        })

    for binary in binaries:
        if binary not in producer:
            sys.exit(f"record_build.py: no action builds {binary} in {aquery_json}")
        visit(binary)

    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "actions.json"), "w") as f:
        json.dump(ordered, f)
    execroot = os.environ.get("EXECROOT", ".")
    copied = 0
    for path in sorted(sources):
        if not path.startswith("external/") or path.startswith("external/local_config_cuda/"):
            continue
        target = os.path.join(out_dir, path)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        shutil.copyfile(os.path.realpath(os.path.join(execroot, path)), target)
        copied += 1
    for d in SYSTEM_HEADER_DIRS:
        if os.path.isdir(d):
            shutil.copytree(d, os.path.join(out_dir, "sysinclude", os.path.basename(d)),
                            dirs_exist_ok=True)
    print(f"record_build.py: {len(ordered)} actions for {len(binaries)} binaries, "
          f"{copied} external files")


if __name__ == "__main__":
    if len(sys.argv) < 4:
        sys.exit("usage: record_build.py AQUERY_JSON OUT_DIR BINARY...")
    main(sys.argv[1], sys.argv[2], sys.argv[3:])
