"""Regroup a Kubernetes 1.20 vendor/modules.txt so Go >= 1.17 accepts it with -mod=vendor.

The 1.20 tarball lists each module twice, `# path version => replacement` then
`# path => replacement`, with the module's packages under the second, unversioned line. Go 1.17
and later read package lines as belonging to the versioned line above them, so the build stops
with "updates to go.mod needed, disabled by -mod=vendor". This moves every package line under
the versioned line of the longest module path that contains it and puts the replacement-only
lines after all of them. Used by scripts/real-apiserver; run as
`python3 real-apiserver-modules.py vendor/modules.txt` (rewrites the file in place).
"""

import sys


def regroup(lines):
    modules = {}  # path -> [header, annotations..., packages...], in file order
    replacements = []
    current = None
    for line in lines:
        if line.startswith("## "):
            if current is not None:
                modules[current].append(line)
        elif line.startswith("# "):
            words = line[2:].split()
            if len(words) > 1 and words[1] != "=>":
                current = words[0]
                modules[current] = [line]
            else:
                replacements.append(line)
        elif line.strip():
            owner = _owner(line.strip(), modules)
            modules[owner].append(line)
    out = [line for block in modules.values() for line in block]
    return out + replacements


def _owner(package, modules):
    candidates = [path for path in modules if package == path or package.startswith(path + "/")]
    if not candidates:
        raise SystemExit(f"no versioned module provides package {package}")
    return max(candidates, key=len)


def main(path):
    with open(path) as handle:
        lines = handle.read().splitlines()
    with open(path, "w") as handle:
        handle.write("\n".join(regroup(lines)) + "\n")


if __name__ == "__main__":
    main(sys.argv[1])
